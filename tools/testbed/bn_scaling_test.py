"""bn_scaling.py on loopback hosts (no privileges needed): 2 hosts of 1 and
of 2 workers, flat and through per-host aggregators, no added delay, a few
exchanges each; the tables name the bed and hold every layout, and the
saved measurements print the same tables again."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RUNFILES = os.path.dirname(os.path.dirname(HERE))  # bazel-bin-shaped


class BnScalingLoopbackTest(unittest.TestCase):
    def test_a_short_sweep_on_loopback_hosts(self):
        with tempfile.TemporaryDirectory() as out:
            saved = os.path.join(out, "scaling.json")
            cmd = [sys.executable, os.path.join(HERE, "bn_scaling.py"),
                   "--bed=loopback", "--bin_dir", RUNFILES, "--aggregate",
                   "--rtt_us=0", "--layouts=2x1,2x2", "--rounds=1",
                   "--reps=20", "--save", saved]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                               cwd=RUNFILES)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            self.assertIn("hosts as loopback addresses", r.stdout)
            for path in ("flat", "aggregated"):
                for k, w in ((1, 2), (2, 4)):
                    self.assertRegex(r.stdout, rf"\| {path} \| 0 \| 2 \| {k} \| {w} \| \d+ \|")
            self.assertRegex(r.stdout, r"\| aggregated \| 0 \| 2 \| 2 \| \d+ / \d+ \| [\d.]+x \|")
            with open(saved) as f:
                data = json.load(f)
            self.assertEqual(data["bed"], "loopback")
            self.assertEqual(len(data["rows"]), 4)
            again = subprocess.run(
                [sys.executable, os.path.join(HERE, "bn_scaling.py"), "--load", saved],
                capture_output=True, text=True, timeout=60, cwd=RUNFILES)
            self.assertEqual(again.returncode, 0, again.stderr)
            self.assertEqual(again.stdout.split("\n")[2:], r.stdout.split("\n")[2:])


if __name__ == "__main__":
    unittest.main()
