"""update_performance_md.py renders canned benchmark logs into a document
with every table filled, and refuses (exit status 1, the old document kept)
when a table is missing, empty, short of rows or has a failed cell. Runs
nothing but the script: the logs are testdata/perf_logs/, taken from a
--quick run.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.join(os.getcwd(), "bench")
SCRIPT = os.path.join(HERE, "update_performance_md.py")
LOGS = os.path.join(HERE, "testdata", "perf_logs")


class UpdatePerformanceMdTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.logs = os.path.join(self.tmp, "logs")
        shutil.copytree(LOGS, self.logs)
        self.out = os.path.join(self.tmp, "performance.md")

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def render(self):
        p = subprocess.Popen(
            [sys.executable, SCRIPT, "--from_logs", self.logs, "--output",
             self.out], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            universal_newlines=True)
        out, err = p.communicate(timeout=60)
        return p.returncode, err

    def edit(self, log, fn):
        path = os.path.join(self.logs, log)
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(fn(text))

    def assert_fails(self, message):
        with open(self.out, "w") as f:
            f.write("the old document\n")
        rc, err = self.render()
        self.assertEqual(rc, 1, err)
        self.assertIn(message, err)
        self.assertIn("was not written", err)
        with open(self.out) as f:
            self.assertEqual(f.read(), "the old document\n")

    def test_good_logs_fill_every_table(self):
        rc, err = self.render()
        self.assertEqual(rc, 0, err)
        with open(self.out) as f:
            doc = f.read()
        self.assertIn("python3 bench/update_performance_md.py", doc)
        self.assertIn("- CPU: AMD EPYC", doc)
        self.assertIn("- Memory: 23.5 GiB", doc)
        self.assertIn("- Kernel: Linux", doc)
        self.assertIn("- Date: ", doc)
        sections = re.findall(r"^## (.*)$", doc, re.M)
        self.assertEqual(len(sections), 6, sections)  # Machine + 5 tables
        # Every row of every table, in order.
        for c in ("64", "256", "1024"):
            for w in ("1", "2", "4", "8"):
                self.assertRegex(doc, r"(?m)^\| {} \| {} \| \d".format(c, w))
        for s in ("1", "2"):
            for mb in ("1", "16", "64"):
                self.assertRegex(doc, r"(?m)^\| {} \| {} \| [\d+]+ \| \d"
                                 .format(mb, s))
        self.assertEqual(len(re.findall(r"(?m)^\| \[32, ", doc)), 10)
        for n in ("262144", "1048576", "4194304", "16777216"):
            self.assertRegex(doc, r"(?m)^\| {} \| \d".format(n))
        self.assertNotIn("fail[", doc)
        # The readings and the figures computed from the tables.
        self.assertIn("below 1", doc)
        self.assertEqual(doc.count("In this run"), 5)
        for w in ("1", "2"):
            for b in ("8", "32"):
                for p in ("local", "sync", "async", "recal", "sync-stream"):
                    self.assertRegex(doc, r"(?m)^\| {} \| {} \| {} \| \d"
                                     .format(w, b, p))
        for b in ("8", "32"):  # co-located replicas, W = 2 only
            self.assertRegex(doc, r"(?m)^\| 2 \| {} \| sync-colocated \| \d"
                             .format(b))
        self.assertRegex(doc, r"(?m)^\| 256 \| 2 \| \d+\.\d \| ")
        self.assertIn("python3 bench/step_overhead.py --runs 3", doc)
        # bnps/gloo at W = 2 in the canned log: 0.39, 0.35 and 0.56.
        self.assertRegex(doc, r"(?m)^\| 2 \| 0\.35 to 0\.56 \(median 0\.39\)")
        self.assertIn("This machine has 2 logical CPUs", doc)
        self.assertNotIn("--quick", doc)

    def test_without_machine_log_reads_this_machine(self):
        os.remove(os.path.join(self.logs, "machine.txt"))
        rc, err = self.render()
        self.assertEqual(rc, 0, err)
        with open(self.out) as f:
            doc = f.read()
        self.assertRegex(doc, r"- Cores: \d+ logical CPUs")

    def test_empty_table_fails(self):
        self.edit("optimizer_benchmark.txt",
                  lambda t: "\n".join(t.splitlines()[:2]) + "\n")
        self.assert_fails("optimizer in optimizer_benchmark.txt: the table "
                          "is empty")

    def test_missing_rows_fail(self):
        self.edit("ps_benchmark.txt", lambda t: "\n".join(
            l for l in t.splitlines() if not l.startswith("| 64 | 2 | 8+8")))
        self.assert_fails("grad in ps_benchmark.txt: missing rows "
                          "[('64', '2')]")

    def test_missing_table_fails(self):
        self.edit("ps_benchmark.txt",
                  lambda t: t.split("## Gradient push + pull")[0])
        self.assert_fails("grad in ps_benchmark.txt: no table under "
                          "'## Gradient push + pull'")

    def test_empty_log_fails(self):
        self.edit("bn_benchmark.txt", lambda t: "")
        self.assert_fails("bn_kernels in bn_benchmark.txt: no table")

    def test_missing_step_overhead_table_fails(self):
        self.edit("step_overhead.txt",
                  lambda t: t.split("## BN round trip")[0])
        self.assert_fails("step_round_trip in step_overhead.txt: no table "
                          "under '## BN round trip beside it'")

    def test_missing_log_fails(self):
        os.remove(os.path.join(self.logs, "bn_benchmark.txt"))
        self.assert_fails("no log ")

    def test_failed_cell_fails_with_its_footnote(self):
        def fail_cell(text):
            text = re.sub(r"(?m)^\| 256 \| 2 \| \d+ \| \d+ \|",
                          "| 256 | 2 | fail[1] |  |", text)
            return text.replace(
                "\n## Gradient",
                "[1] DEADLINE_EXCEEDED: no call was timed\n\n## Gradient")
        self.edit("ps_benchmark.txt", fail_cell)
        self.assert_fails("'fail[1]', not a number ([1] DEADLINE_EXCEEDED")


if __name__ == "__main__":
    unittest.main()
