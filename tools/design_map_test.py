"""docs/design.md's component map against the BUILD files.

The map is the table under "## Components and dependency direction" in
docs/design.md, one row a top-level folder:

    | folder | its job | may use |
    |---|---|---|
    | `server/` | a shard server ... | `proto`, `bn`, `util` |

This test reads the map and every BUILD file of the tree (textually: the
"//folder..." labels a rule names in its attributes, visibility left out, and
the files load() reads) and fails, naming the folder and the label, when

  (a) a top-level folder that holds a BUILD file is missing from the map,
  (b) the map names a folder (as a row or in a "may use" cell) that does
      not exist or holds no BUILD file,
  (c) a BUILD file depends on a folder its row's "may use" does not list.

A folder may always use itself. Standard library only: it runs under a bare
python3 and under /usr/bin/python3, from Bazel or by hand from anywhere:

    python3 tools/design_map_test.py
"""

import os
import re
import shutil
import sys
import tempfile
import unittest

MAP_DOC = os.path.join("docs", "design.md")
MAP_HEADING = "## Components and dependency direction"
ROOT = "(root)"  # how the map names the package of the root BUILD file
# Attributes whose labels are not dependencies.
NOT_DEPS = frozenset(["visibility", "default_visibility", "packages", "name"])
# Bazel's own packages, not folders of the tree.
BAZEL_PACKAGES = frozenset(["conditions", "visibility"])
BUILD_NAMES = ("BUILD", "BUILD.bazel")
SKIP_DIRS = frozenset([".git", "node_modules"])


def repo_root():
    """The source tree this file belongs to (through Bazel's runfiles link)."""
    here = os.path.dirname(os.path.realpath(os.path.abspath(__file__)))
    return os.path.dirname(here)


# --- the map ---------------------------------------------------------------

def _cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _folder_name(cell):
    name = cell.replace("`", "").strip()
    return name if name == ROOT else name.rstrip("/")


def parse_map(text):
    """Returns ({folder: set of folders it may use}, [problems]).

    The map is the first table after MAP_HEADING whose header reads
    folder | its job | may use. A "may use" cell lists folders in backticks;
    a cell without backticks ("nothing", "-") allows no other folder.
    """
    problems = []
    start = text.find(MAP_HEADING)
    if start < 0:
        return {}, ["%s has no heading %r: the component map lives under it"
                    % (MAP_DOC, MAP_HEADING)]
    lines = text[start:].splitlines()[1:]
    table = None
    for i, line in enumerate(lines):
        if line.startswith("## "):
            break
        if line.lstrip().startswith("|"):
            head = [c.lower() for c in _cells(line)]
            if head[:1] == ["folder"] and head[-1:] == ["may use"]:
                table = lines[i + 2:]  # past the header and its |---| line
                break
    if table is None:
        return {}, ["%s: no table with the header | folder | its job | "
                    "may use | under %r" % (MAP_DOC, MAP_HEADING)]
    allowed = {}
    for line in table:
        if not line.lstrip().startswith("|"):
            break
        cells = _cells(line)
        if len(cells) != 3:
            problems.append("%s: the map's row %r has %d cells, not 3 "
                            "(folder | its job | may use)"
                            % (MAP_DOC, line.strip(), len(cells)))
            continue
        folder = _folder_name(cells[0])
        if folder in allowed:
            problems.append("%s: the map lists %s twice; keep one row"
                            % (MAP_DOC, folder))
        allowed[folder] = set(_folder_name(u)
                              for u in re.findall(r"`([^`]+)`", cells[2]))
    return allowed, problems


# --- the BUILD files -------------------------------------------------------

_TOKEN = re.compile(r'''
    (?P<string>"""(?:\\.|[^\\])*?"""|\'\'\'(?:\\.|[^\\])*?\'\'\'
              |"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
  | (?P<comment>\#[^\n]*)
  | (?P<ident>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<punct>[()\[\]{},=:+])
  | (?P<space>\s+)
  | (?P<other>.)
''', re.VERBOSE | re.DOTALL)


def _tokens(text):
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if kind in ("comment", "space"):
            continue
        value = m.group(kind)
        if kind == "string":
            quote = 3 if value[:3] in ('"""', "'''") else 1
            value = value[quote:-quote]
        yield kind, value


def build_labels(text):
    """Yields (attribute, label) for each string a BUILD file's calls pass.

    The attribute is the keyword the string came under (deps, data, srcs,
    actual, ...), "load" for a load() statement's file, or "" for a
    positional argument; strings inside select() and list concatenations
    belong to the keyword they are under.
    """
    depth = 0
    keyword = {}  # bracket depth -> keyword whose value is being read
    call = {}     # bracket depth -> name of the function called there
    prev = [None, None]  # the two tokens before this one
    for kind, value in _tokens(text):
        if kind == "punct" and value in "([{":
            depth += 1
            if value == "(" and prev[-1] and prev[-1][0] == "ident":
                call[depth] = prev[-1][1]
            else:
                call.pop(depth, None)
            keyword.pop(depth, None)
        elif kind == "punct" and value in ")]}":
            keyword.pop(depth, None)
            call.pop(depth, None)
            depth = max(depth - 1, 0)
        elif kind == "punct" and value == "=" and prev[-1] and \
                prev[-1][0] == "ident" and prev[-2] and \
                prev[-2][1] in ("(", ","):
            keyword[depth] = prev[-1][1]
        elif kind == "punct" and value == "," and depth in keyword:
            del keyword[depth]
        elif kind == "string":
            attr = ""
            for d in range(depth, 0, -1):
                if d in keyword:
                    attr = keyword[d]
                    break
            if not attr and call.get(depth) == "load":
                attr = "load"
            yield attr, value
        prev = [prev[-1], (kind, value)]


def label_folder(label):
    """The top-level folder a "//..." label names, ROOT for "//:x", or None
    for labels of other repositories, relative labels and Bazel's own."""
    if not label.startswith("//"):
        return None
    package = label[2:].split(":", 1)[0]
    top = package.split("/", 1)[0]
    if not top:
        return ROOT
    if top in BAZEL_PACKAGES:
        return None
    return top


def build_files(root):
    """Yields (path relative to root, its top-level folder) of every BUILD."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if d not in SKIP_DIRS and
                             not d.startswith("bazel-"))
        rel = os.path.relpath(dirpath, root)
        for name in BUILD_NAMES:
            if name in filenames:
                top = ROOT if rel == "." else rel.split(os.sep, 1)[0]
                yield os.path.join(rel, name) if rel != "." else name, top


def _bazelignored(root):
    path = os.path.join(root, ".bazelignore")
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return set(line.strip().rstrip("/") for line in f
                   if line.strip() and not line.startswith("#"))


def _shown(folder):
    return folder if folder == ROOT else folder + "/"


# --- the check -------------------------------------------------------------

def check(root):
    """Every way the tree and its map disagree, each a sentence that says
    what to edit."""
    with open(os.path.join(root, MAP_DOC)) as f:
        allowed, problems = parse_map(f.read())
    ignored = _bazelignored(root)
    builds = [(p, top) for p, top in build_files(root)
              if not any(p == i or p.startswith(i + os.sep) for i in ignored)]
    folders = sorted(set(top for _, top in builds))

    for folder in folders:
        if folder not in allowed:
            problems.append(
                "(a) %s holds a BUILD file but is missing from the map: add "
                "a row | `%s` | its job | may use | to the table under %r "
                "in %s" % (_shown(folder), _shown(folder), MAP_HEADING,
                           MAP_DOC))
    for folder in sorted(allowed):
        if folder not in folders:
            problems.append(
                "(b) the map in %s names %s, which is not a top-level folder "
                "with a BUILD file: remove its row (or fix its name)"
                % (MAP_DOC, folder))
    for folder in sorted(allowed):
        for used in sorted(allowed[folder] - set(folders)):
            problems.append(
                "(b) the map in %s lets %s use %s, which is not a top-level "
                "folder with a BUILD file: remove it from the \"may use\" "
                "cell of %s's row (or fix its name)"
                % (MAP_DOC, folder, used, folder))

    for path, top in builds:
        if top not in allowed:
            continue  # reported under (a)
        with open(os.path.join(root, path)) as f:
            text = f.read()
        seen = set()
        for attr, label in build_labels(text):
            if attr in NOT_DEPS:
                continue
            used = label_folder(label)
            if used is None or used == top or used in allowed[top]:
                continue
            if (used, label) in seen:
                continue
            seen.add((used, label))
            problems.append(
                "(c) %s: %s depends on %s (%s = %s), which the map does not "
                "allow: add `%s` to the \"may use\" cell of %s's row in %s if "
                "the dependency is meant, or remove it from %s"
                % (path, top, used, attr or "argument", label, used, top,
                   MAP_DOC, path))
    return problems


class DesignMapTest(unittest.TestCase):

    def test_the_map_matches_the_build_files(self):
        problems = check(repo_root())
        if problems:
            self.fail("docs/design.md's component map and the BUILD files "
                      "disagree:\n" + "\n".join(problems))


class ParserTest(unittest.TestCase):
    """The parser and the checks on small made-up trees, so a check that
    stopped seeing anything would fail here."""

    MAP = "\n".join([
        "# design", "", MAP_HEADING, "",
        "| folder | its job | may use |",
        "|---|---|---|",
        "| `(root)` | aliases | `a/` |",
        "| `a/` | one job | nothing |",
        "| `b/` | another | `a`, `third_party` |",
        "| `third_party/` | system libraries | - |",
        "", "## next", ""])

    def make_tree(self, files):
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root)
        for path, text in files.items():
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(text)
        return root

    def tree(self, **extra):
        files = {
            "docs/design.md": self.MAP,
            "BUILD": 'alias(name = "x", actual = "//a:x")\n',
            "a/BUILD": 'cc_library(name = "x", visibility = ["//b:__pkg__"])\n',
            "b/BUILD": 'load("//a:defs.bzl", "m")\n'
                       'cc_library(name = "y", deps = ["//a:x", '
                       '"//third_party/system:absl", ":z"])\n',
            "b/sub/BUILD": 'cc_test(name = "t", deps = ["//b:y"])\n',
            "third_party/system/BUILD": 'cc_library(name = "absl")\n',
        }
        files.update(extra)
        return self.make_tree(files)

    def test_a_consistent_tree_passes(self):
        self.assertEqual(check(self.tree()), [])

    def test_parse_map(self):
        allowed, problems = parse_map(self.MAP)
        self.assertEqual(problems, [])
        self.assertEqual(allowed, {ROOT: {"a"}, "a": set(),
                                   "b": {"a", "third_party"},
                                   "third_party": set()})

    def test_labels_by_attribute(self):
        text = '''
load("//bazel:cuda.bzl", "cuda_library")
# "//commented:out"
cc_library(
    name = "k",
    srcs = select({
        "//conditions:default": ["k.cc"],
        "//bazel:cuda_on": ["//nn:k.cu"],
    }) + ["//x:more"],
    visibility = ["//server:__pkg__", "//tests:__subpackages__"],
    deps = [":local", "@com_google_absl//absl/status",
            "//proto:p"],
    data = glob(["*.json"]) + ["//deploy/grafana:bnps.json"],
)
'''
        got = [(a, l) for a, l in build_labels(text) if l.startswith("//")]
        self.assertEqual(got, [
            ("load", "//bazel:cuda.bzl"),
            ("srcs", "//conditions:default"), ("srcs", "//bazel:cuda_on"),
            ("srcs", "//nn:k.cu"), ("srcs", "//x:more"),
            ("visibility", "//server:__pkg__"),
            ("visibility", "//tests:__subpackages__"),
            ("deps", "//proto:p"), ("data", "//deploy/grafana:bnps.json")])
        self.assertEqual(
            [label_folder(l) for _, l in got],
            ["bazel", None, "bazel", "nn", "x", "server", "tests", "proto",
             "deploy"])
        self.assertEqual(label_folder("//:bnps_server"), ROOT)
        self.assertIsNone(label_folder("@repo//a:b"))

    def test_a_folder_missing_from_the_map(self):
        problems = check(self.tree(**{"c/BUILD": 'cc_library(name = "c")\n'}))
        self.assertEqual(len(problems), 1, problems)
        self.assertTrue(problems[0].startswith("(a) c/ "), problems)

    def test_a_row_without_a_folder(self):
        root = self.tree()
        shutil.rmtree(os.path.join(root, "a"))
        problems = check(root)
        self.assertTrue(any(p.startswith("(b)") and " names a," in p
                            for p in problems), problems)

    def test_a_dependency_the_map_does_not_allow(self):
        problems = check(self.tree(**{
            "a/BUILD": 'cc_library(name = "x",\n'
                       '    deps = ["//b:y"],  # a may use nothing\n)\n'}))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("(c) a/BUILD: a depends on b (deps = //b:y)",
                      problems[0])
        self.assertIn("`b`", problems[0])

    def test_a_data_dependency_of_the_root_and_a_subfolder(self):
        problems = check(self.tree(**{
            "BUILD": 'sh_test(name = "t", data = ["//b:y"])\n',
            "b/sub/BUILD": 'py_test(name = "t", data = ["//:t"])\n'}))
        self.assertEqual(sorted(p.split(":")[0] for p in problems),
                         ["(c) BUILD", "(c) b/sub/BUILD"], problems)

    def test_bazelignored_folders_are_left_out(self):
        root = self.tree(**{
            ".bazelignore": "# npm\nnm\n",
            "nm/pkg/BUILD": 'x(deps = ["//zzz:q"])\n'})
        self.assertEqual(check(root), [])

    def test_a_may_use_cell_naming_no_folder(self):
        root = self.tree(**{"docs/design.md": self.MAP.replace(
            "`a`, `third_party`", "`a`, `thrid_party`")})
        problems = check(root)
        self.assertTrue(any(p.startswith("(b)") and "lets b use thrid_party"
                            in p for p in problems), problems)
        self.assertTrue(any(p.startswith("(c) b/BUILD: b depends on "
                                         "third_party") for p in problems),
                        problems)

    def test_no_map(self):
        root = self.tree(**{"docs/design.md": "# design\n"})
        problems = check(root)
        self.assertIn(MAP_HEADING, problems[0])


if __name__ == "__main__":
    unittest.main()
