"""The PyTorch example end to end, small: 2 workers and 1 shard on
127.0.0.1, 64 steps of batch 16 per worker, real Fashion-MNIST
(tools/setup.sh installs it and python3-torch). It must exit 0, print the
result line, and beat chance (10%) clearly. Also --policy local with
--recalibrate, which prints the accuracy after recalibration too."""

import os
import re
import subprocess
import sys
import unittest

RUNFILES = os.getcwd()
sys.path.insert(0, os.path.join(RUNFILES, "python"))  # Bazel runfiles
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
TRAIN = os.path.join(RUNFILES, "examples", "pytorch", "train.py")


def run(*flags):
    env = dict(os.environ, PYTHONPATH=os.path.join(RUNFILES, "python"))
    env.pop("BNPS_WORKER", None)
    return subprocess.run(
        [sys.executable, TRAIN, "--workers=2", "--servers=1",
         "--train_examples=2048", "--batch_size=16", "--test_examples=1000",
         "--recal_examples=256", "--timeout_s=240"] + list(flags),
        env=env, capture_output=True, text=True, timeout=300)


class ExampleTest(unittest.TestCase):
    def test_sync_trains_to_a_test_accuracy(self):
        r = run("--policy=sync")
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        m = re.search(r"\[w0\] result: policy=sync workers=2 steps=64 .*"
                      r"test_accuracy=([0-9.]+)", r.stdout)
        self.assertIsNotNone(m, r.stdout[-3000:])
        self.assertGreater(float(m.group(1)), 0.4)

    def test_local_with_recalibration(self):
        r = run("--policy=local", "--recalibrate")
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        m = re.search(r"result: policy=local .*test_accuracy=([0-9.]+) "
                      r"recal_accuracy=([0-9.]+)", r.stdout)
        self.assertIsNotNone(m, r.stdout[-3000:])
        self.assertGreater(float(m.group(2)), 0.4)


if __name__ == "__main__":
    unittest.main()
