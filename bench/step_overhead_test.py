"""step_overhead.py runs the real server and worker binaries a few steps and
prints its tables whole (not how fast: that is the tool's job). Also checks
that the worker's --timing_warmup_steps leaves the warm-up out of its report.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.join(os.getcwd(), "bench")
sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles
from bnps.cluster import parse_listening, server_command  # noqa: E402
TOOL = os.path.join(HERE, "step_overhead.py")
NUM = r"\d+\.\d+"
STEP_ROW = re.compile(r"^\| 1 \| 4 \| (local|sync|async|recal|sync-stream) \| ({0}) \| "
                      r"({0}) \| ({0}) \| ({0}) \| ({0}) \| (.+) \|$"
                      .format(NUM))
RATIO_ROW = re.compile(r"^\| 1 \| 4 \| (local|sync|async|recal|sync-stream) \| ({0}) \| "
                       r"({0}) \| ({0}) \|$".format(NUM))


def run(args, timeout=240):
    return subprocess.run([sys.executable, TOOL, "--bin_dir", os.getcwd()] +
                          args, capture_output=True, text=True,
                          timeout=timeout)


class StepOverheadTest(unittest.TestCase):
    def test_tiny_run_prints_every_row(self):
        r = run(["--workers", "1", "--batches", "4", "--steps", "3",
                 "--warmup", "2", "--runs", "2", "--round_trip", "off"])
        self.assertEqual(r.returncode, 0, r.stderr)
        steps = [STEP_ROW.match(l) for l in r.stdout.splitlines()]
        steps = [m.groups() for m in steps if m]
        self.assertEqual([s[0] for s in steps],
                         ["local", "sync", "async", "recal", "sync-stream"],
                         r.stdout)
        for policy, total, compute, bn, grad, ratio, cores in steps:
            # The split adds up to the step (each cell rounded to 0.001).
            self.assertAlmostEqual(float(total),
                                   float(compute) + float(bn) + float(grad),
                                   delta=0.003)
            self.assertGreater(float(total), 0)
            if policy in ("local", "recal"):
                self.assertEqual(float(bn), 0.0, policy)  # no BN exchange
            else:
                self.assertGreater(float(bn), 0.0, policy)
        self.assertEqual(steps[0][5], "1.00")
        ratios = [RATIO_ROW.match(l) for l in r.stdout.splitlines()]
        ratios = [m.groups() for m in ratios if m]
        self.assertEqual(len(ratios), 5, r.stdout)
        for _, lo, mid, hi in ratios:
            self.assertLessEqual(float(lo), float(mid))
            self.assertLessEqual(float(mid), float(hi))
        self.assertIn("2 run(s)", r.stdout)

    def test_server_flags_reach_the_servers(self):
        # A negative hold is refused by bnps_server (exit status 2), which
        # the tool reports with the server's log.
        r = run(["--workers", "1", "--batches", "4", "--steps", "2",
                 "--warmup", "0", "--policies", "local", "--round_trip",
                 "off", "--server_flag=--keep_awake_us=-1"])
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertIn("--keep_awake_us must be >= 0", r.stdout + r.stderr)
        r = run(["--workers", "1", "--batches", "4", "--steps", "2",
                 "--warmup", "0", "--policies", "local,sync",
                 "--round_trip", "off",
                 "--server_flag=--keep_awake_us=500"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("then --keep_awake_us=500", r.stdout)

    def test_bad_policy_is_usage_error(self):
        r = run(["--policies", "sync,bogus"])
        self.assertEqual(r.returncode, 2)
        self.assertIn("bogus", r.stderr)

    def test_worker_report_leaves_warmup_out(self):
        tmp = tempfile.mkdtemp()
        server = subprocess.Popen(
            server_command(os.path.join(os.getcwd(), "server", "bnps_server"),
                           port=0, num_workers=1, policy="sync"),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            line = server.stdout.readline()
            port = parse_listening(line).rsplit(":", 1)[1]
            report = os.path.join(tmp, "w.json")
            w = subprocess.run(
                [os.path.join(os.getcwd(), "worker", "bnps_worker"),
                 "--servers=127.0.0.1:" + port, "--data=synthetic",
                 "--batch_size=4", "--max_steps=7",
                 "--timing_warmup_steps=5", "--eval=none", "--progress=none",
                 "--report=" + report], capture_output=True, text=True,
                timeout=120)
            self.assertEqual(w.returncode, 0, w.stderr)
            with open(report) as f:
                rep = json.load(f)
            self.assertEqual(rep["steps"], 7)
            self.assertEqual(rep["timed_steps"], 2)
            self.assertEqual(rep["examples"], 28)
            # images/s counts the timed steps' examples only.
            self.assertAlmostEqual(rep["images_per_second"],
                                   8 / rep["seconds"]["total"], delta=
                                   0.01 * rep["images_per_second"] + 1)
        finally:
            server.terminate()
            server.wait(10)


class PlacementTest(unittest.TestCase):
    """Which CPUs each process gets, from a made-up sysfs topology."""

    def setUp(self):
        sys.path.insert(0, HERE)
        import step_overhead
        self.so = step_overhead
        self.sysfs = tempfile.TemporaryDirectory()
        # 8 CPUs, 4 cores: CPU c and c + 4 are siblings (as many VMs number
        # them), CPU 7 missing from sysfs (then a core of its own).
        for c in range(7):
            d = os.path.join(self.sysfs.name, "cpu%d" % c, "topology")
            os.makedirs(d)
            with open(os.path.join(d, "thread_siblings_list"), "w") as f:
                f.write("%d,%d\n" % (c % 4, c % 4 + 4))

    def tearDown(self):
        self.sysfs.cleanup()

    def groups(self, cpus):
        return self.so.physical_cores(cpus, sysfs=self.sysfs.name)

    def test_siblings_grouped(self):
        self.assertEqual(self.groups(range(8)),
                         [[0, 4], [1, 5], [2, 6], [3], [7]])

    def test_whole_physical_cores_where_enough(self):
        s, w, shared, where = self.so.placement(1, 2, self.groups(range(8)))
        self.assertEqual((s, w), ([{0, 4}], [{1, 5}, {2, 6}]))
        self.assertFalse(shared)
        self.assertEqual(where, "own physical core each")

    def test_a_cpu_each_spread_over_cores_first(self):
        # 6 processes, 5 cores: one CPU each, the siblings last.
        s, w, shared, where = self.so.placement(1, 5, self.groups(range(8)))
        self.assertEqual(s + w, [{0}, {1}, {2}, {3}, {7}, {4}])
        self.assertEqual((shared, where), (False, "own core each"))

    def test_round_robin_where_too_few(self):
        s, w, shared, where = self.so.placement(1, 3, self.groups([0, 4]))
        self.assertEqual(s + w, [{0}, {4}, {0}, {4}])
        self.assertTrue(shared)
        self.assertEqual(where, "shared: 4 processes on 2 cores")

    def test_even_shares_whole_cores_servers_first(self):
        s, w, shared, where = self.so.placement(
            1, 2, [[c] for c in range(16)], "even")
        self.assertEqual(s + w, [set(range(0, 6)), set(range(6, 11)),
                                 set(range(11, 16))])
        self.assertEqual((shared, where), (False, "own 5-6 cores each"))
        s, w, _, where = self.so.placement(1, 1, self.groups(range(8)),
                                           "even")
        self.assertEqual((s, w), ([{0, 4, 1, 5, 2, 6}], [{3, 7}]))
        self.assertEqual(where, "own 2-3 physical cores each")
        s, w, _, where = self.so.placement(1, 3, [[c] for c in range(8)],
                                           "even")
        self.assertEqual(s + w, [{0, 1}, {2, 3}, {4, 5}, {6, 7}])
        self.assertEqual(where, "own 2 cores each")

    def test_even_with_a_core_each_is_one(self):
        self.assertEqual(
            self.so.placement(1, 4, self.groups(range(8)), "even"),
            self.so.placement(1, 4, self.groups(range(8))))

    def test_no_hyperthreads(self):
        s, w, shared, where = self.so.placement(
            1, 1, [[0], [1]])
        self.assertEqual((s, w, where), ([{0}], [{1}], "own core each"))


if __name__ == "__main__":
    unittest.main()
