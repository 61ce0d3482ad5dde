"""The PyTorch example under torchrun (Debian's torch 1.13:
`python3 -m torch.distributed.run`), in both documented layouts of the
servers, small (64 steps of batch 16 per worker on real Fashion-MNIST):

(a) servers in their own processes (as in their own pods): a LocalCluster of
    2 shards, and `torchrun --nproc_per_node=2 train.py` with BNPS_SERVERS;
(b) one server per node, started by the node's local rank 0: two torchrun
    groups on 127.0.0.1 (`--nnodes=2 --node_rank=0|1 --nproc_per_node=1`, a
    gloo process group of 2), no BNPS_SERVERS; each node's server is a shard
    of the job.

Two workers each, not more: every worker process imports torch and trains,
and the layouts are what is tested.

Each must exit 0 and print a test accuracy clearly above chance (10%).

Debian's torch 1.13 under Python 3.11 fails in torchrun's own argument
parsing with the default --redirects=0 (Std.from_str returns None there), so
the commands pass `--redirects 1 --tee 1` (stdout to a log file and the
console), which torch 2.x accepts as well."""

import os
import re
import socket
import subprocess
import sys
import tempfile
import unittest

RUNFILES = os.getcwd()
sys.path.insert(0, os.path.join(RUNFILES, "python"))  # Bazel runfiles
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
TRAIN = os.path.join(RUNFILES, "examples", "pytorch", "train.py")
PYDIR = os.path.join(RUNFILES, "python")
# The package, then whatever the caller's path has (the extension, when
# run from the source tree: docs/pytorch.md).
PYTHONPATH = os.pathsep.join(
    [PYDIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
               if p])
sys.path.insert(0, PYDIR)

from bnps.cluster import LocalCluster  # noqa: E402

STEPS = 64  # per worker, of batch 16


def example(workers):
    return [f"--train_examples={STEPS * 16 * workers}", "--batch_size=16",
            "--test_examples=1000"]


# torchrun's own logs (a folder per run), removed when the test ends: by
# default it leaves a torchelastic_* folder in /tmp each time.
LOGS = tempfile.TemporaryDirectory(prefix="bnps-torchrun-")


def torchrun(*flags):
    return [sys.executable, "-m", "torch.distributed.run", "--redirects", "1",
            "--tee", "1", "--log_dir", LOGS.name] + list(flags) + [TRAIN]


def env(**extra):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("BNPS_WORKER", "BNPS_NUM_WORKERS", "RANK"))}
    e.update(PYTHONPATH=PYTHONPATH, OMP_NUM_THREADS="1", **extra)
    return e


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accuracy(test, out, workers):
    m = re.search(rf"result: policy=sync workers={workers} steps=(\d+) .*"
                  r"test_accuracy=([0-9.]+)", out)
    test.assertIsNotNone(m, out[-4000:])
    test.assertEqual(int(m.group(1)), STEPS)
    return float(m.group(2))


class TorchrunTest(unittest.TestCase):
    def test_servers_in_their_own_processes(self):
        with LocalCluster(num_servers=2, num_workers=2, policy="sync",
                          job="pytorch-example",
                          server_flags=["--learning_rate=0.1",
                                        "--momentum=0.9"]) as cluster:
            r = subprocess.run(
                torchrun("--nproc_per_node=2") + example(2),
                env=env(BNPS_SERVERS=cluster.servers,
                        BNPS_JOB="pytorch-example"),
                capture_output=True, text=True, timeout=240)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out[-4000:])
        self.assertGreater(accuracy(self, out, 2), 0.4)

    def test_two_nodes_each_with_its_own_server(self):
        port = free_port()
        nodes = [subprocess.Popen(
            torchrun("--nnodes=2", f"--node_rank={node}",
                     "--nproc_per_node=1", "--master_addr=127.0.0.1",
                     f"--master_port={port}") + example(2),
            env=env(BNPS_SERVER_HOST="127.0.0.1"), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
        outs = []
        for p in nodes:
            try:
                outs.append(p.communicate(timeout=240)[0])
            except subprocess.TimeoutExpired:
                for q in nodes:
                    q.kill()
                self.fail("a node hung: " + str([q.args for q in nodes]))
        for node, p in enumerate(nodes):
            self.assertEqual(p.returncode, 0, f"node {node}: " +
                             outs[node][-4000:])
        servers = re.search(r"servers \(one per node\): (\S+)", outs[0])
        self.assertIsNotNone(servers, outs[0][-4000:])
        self.assertEqual(len(servers.group(1).split(",")), 2, servers.group(1))
        self.assertGreater(accuracy(self, outs[0], 2), 0.4)


if __name__ == "__main__":
    unittest.main()
