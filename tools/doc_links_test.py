"""Every relative link of the project's Markdown files leads somewhere.

For each .md file of the tree (third_party/ and build outputs left out), each
link [text](target) whose target is not a URL must name a file or folder that
exists, relative to the linking file, and a #fragment must be one of the
target's headings as GitHub anchors them (lower case, punctuation dropped,
spaces as hyphens, -1, -2... for repeats). Links inside code are not links.
A failure names the file, the line and the link, and says what to edit.

Standard library only; runs under a bare python3 and /usr/bin/python3, from
Bazel or by hand:

    python3 tools/doc_links_test.py
"""

import os
import re
import shutil
import tempfile
import unittest

SKIP_DIRS = frozenset([".git", "third_party", "node_modules"])
LINK = re.compile(r"(!?)\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def repo_root():
    here = os.path.dirname(os.path.realpath(os.path.abspath(__file__)))
    return os.path.dirname(here)


def markdown_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIP_DIRS and not d.startswith("bazel-")
                             and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(".md"):
                yield os.path.relpath(os.path.join(dirpath, name), root)


def _prose_lines(text):
    """(line number, line) outside fenced code, inline code blanked out."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, re.sub(r"`[^`]*`", lambda m: " " * len(m.group()), line)


def slug(heading):
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"<[^>]+>", "", heading)            # inline HTML
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)              # punctuation, backticks
    return text.replace(" ", "-")


def anchors(text):
    seen, out = {}, set()
    for _, line in _headings(text):
        base = slug(line)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else "%s-%d" % (base, n))
    return out


def _headings(text):
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and not fenced:
            yield number, m.group(1)


def check(root):
    problems = []
    cache = {}

    def anchors_of(path):
        if path not in cache:
            with open(path, encoding="utf-8") as f:
                cache[path] = anchors(f.read())
        return cache[path]

    for md in markdown_files(root):
        full = os.path.join(root, md)
        with open(full, encoding="utf-8") as f:
            text = f.read()
        for number, line in _prose_lines(text):
            for m in LINK.finditer(line):
                target = m.group(3)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                    continue  # http:, https:, mailto: ...
                path, _, fragment = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(full), path)) \
                    if path else full
                where = "%s:%d: [%s](%s)" % (md, number, m.group(2), target)
                if not os.path.exists(dest):
                    problems.append("%s: %s does not exist; point the link at "
                                    "the file that now holds it"
                                    % (where, os.path.relpath(dest, root)))
                    continue
                if fragment and dest.endswith(".md") and \
                        fragment not in anchors_of(dest):
                    problems.append("%s: %s has no heading with the anchor "
                                    "#%s; link to one of its headings (or "
                                    "restore the heading)"
                                    % (where, os.path.relpath(dest, root),
                                       fragment))
    return problems


class DocLinksTest(unittest.TestCase):

    def test_every_link_leads_somewhere(self):
        problems = check(repo_root())
        if problems:
            self.fail("%d broken links:\n%s" % (len(problems),
                                                "\n".join(problems)))


class CheckerTest(unittest.TestCase):
    """The checker on a made-up tree, so one that stopped seeing links fails."""

    def tree(self, files):
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root)
        for path, text in files.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w", encoding="utf-8") as f:
                f.write(text)
        return root

    def test_slugs(self):
        self.assertEqual(slug("Run servers and workers yourself"),
                         "run-servers-and-workers-yourself")
        self.assertEqual(slug("`SyncBatchNorm` and `convert_sync_batchnorm`"),
                         "syncbatchnorm-and-convert_sync_batchnorm")
        self.assertEqual(slug("Kills and restarts: what survives what"),
                         "kills-and-restarts-what-survives-what")
        self.assertEqual(slug("On a GPU: NVIDIA H100 80GB HBM3"),
                         "on-a-gpu-nvidia-h100-80gb-hbm3")
        self.assertEqual(anchors("# A\n## Tests\n## Tests\n"),
                         {"a", "tests", "tests-1"})

    def test_good_and_broken_links(self):
        root = self.tree({
            "README.md": "See [d](docs/d.md#the-part), [x](https://x.org),\n"
                         "[top](#readme), [gone](docs/gone.md), "
                         "[bad](docs/d.md#nope), [dir](tools/).\n"
                         "`[code](not/a/link.md)`\n"
                         "```\n[fenced](not/a/link.md)\n```\n# README\n",
            "docs/d.md": "# D\n## The part\nBack to [the README](../README.md).\n",
            "tools/x.py": "",
        })
        problems = check(root)
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("README.md:2: [gone](docs/gone.md): docs/gone.md does "
                      "not exist", problems[0])
        self.assertIn("README.md:2: [bad](docs/d.md#nope): docs/d.md has no "
                      "heading with the anchor #nope", problems[1])


if __name__ == "__main__":
    unittest.main()
