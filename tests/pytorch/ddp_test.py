"""bnps.torch beside DistributedDataParallel (gloo, Debian's torch 1.13):
DDP averages the gradients, bnps merges BN. 2 processes with torchrun's
variables (RANK, WORLD_SIZE, MASTER_*) and a LocalCluster's BNPS_SERVERS.

- sync, with DDP's broadcast_buffers off and on: outputs, parameters and
  running statistics after 4 SGD steps equal one process with torch's BN on
  the concatenated batch (float64). On: DDP copies rank 0's running
  statistics into rank 1 before each forward, which changes nothing, since
  under sync they are equal on every rank by construction.
- local and recal: the parameters equal one process applying the model to
  each rank's slice separately (local statistics) and averaging the losses,
  which is what DDP with local BN computes; local's running statistics are
  then averaged by sync_running_stats, recal's recalibrated, alike on both.
- async (staleness 1): runs, finite, the servers' statistics on both.
"""

import os
import socket
import subprocess
import sys
import tempfile
import unittest

RUNFILES = os.getcwd()
HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.join(RUNFILES, "python")
# The package, then whatever the caller's path has (the extension, when
# run from the source tree: docs/pytorch.md).
PYTHONPATH = os.pathsep.join(
    [PYDIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
               if p])
sys.path.insert(0, PYDIR)
sys.path.insert(0, HERE)

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                             "python"))  # run from a checkout: torch_or_debian.py
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402

import ddp_cases  # noqa: E402
from bnps.cluster import LocalCluster  # noqa: E402

WORKER = os.path.join(HERE, "ddp_worker.py")
F64 = dict(rtol=1e-9, atol=1e-9)
RUNNING = ("running_mean", "running_var", "num_batches_tracked")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(scenario, policy, flags=()):
    with LocalCluster(num_servers=2, num_workers=ddp_cases.WORKERS,
                      policy=policy, server_flags=list(flags)) as cluster, \
            tempfile.TemporaryDirectory() as out:
        port = free_port()
        procs = []
        for rank in range(ddp_cases.WORKERS):
            env = cluster.worker_env(rank)
            del env["BNPS_WORKER"], env["BNPS_NUM_WORKERS"]
            env.update(PYTHONPATH=PYTHONPATH, OMP_NUM_THREADS="1",
                       RANK=str(rank), LOCAL_RANK=str(rank),
                       WORLD_SIZE=str(ddp_cases.WORKERS),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen(
                [sys.executable, WORKER, scenario, out], env=env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = []
        for p in procs:
            try:
                logs.append(p.communicate(timeout=180)[0])
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise AssertionError(f"{scenario}: a rank hung") from None
        for rank, p in enumerate(procs):
            if p.returncode != 0:
                raise AssertionError(f"{scenario} rank {rank} exited "
                                     f"{p.returncode}:\n{logs[rank][-4000:]}")
        return [torch.load(os.path.join(out, f"{scenario}_w{r}.pt"))
                for r in range(ddp_cases.WORKERS)]


def train_reference(per_slice):
    """torch BN in one process: on the global batch, or (per_slice) on each
    rank's slice separately with the losses averaged."""
    model = ddp_cases.model()
    opt = torch.optim.SGD(model.parameters(), lr=ddp_cases.LR)
    outputs = []
    for step in range(ddp_cases.STEPS):
        x, y = ddp_cases.data(step)
        opt.zero_grad()
        if per_slice:
            parts = [model(x[ddp_cases.rows(r)])
                     for r in range(ddp_cases.WORKERS)]
            loss = sum(torch.nn.functional.cross_entropy(
                p, y[ddp_cases.rows(r)]) for r, p in enumerate(parts))
            loss = loss / ddp_cases.WORKERS
            logits = torch.cat(parts)
        else:
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        outputs.append(logits.detach())
    return model, outputs


class DdpSyncTest(unittest.TestCase):
    def check_sync(self, scenario):
        got = run(scenario, "sync")
        model, outputs = train_reference(per_slice=False)
        for rank, g in enumerate(got):
            rows = ddp_cases.rows(rank)
            for step in range(ddp_cases.STEPS):
                torch.testing.assert_close(
                    g["y"][step], outputs[step][rows], **F64,
                    msg=f"step {step} rank {rank}")
            for key, value in model.state_dict().items():
                torch.testing.assert_close(g["state"][key], value, **F64,
                                           msg=f"{key} rank {rank}")
        # They moved: not the initial state twice.
        start = ddp_cases.model().state_dict()
        self.assertFalse(torch.allclose(start["0.weight"],
                                        model.state_dict()["0.weight"]))
        self.assertFalse(torch.allclose(start["1.running_mean"],
                                        model.state_dict()["1.running_mean"]))

    def test_sync_without_buffer_broadcast_equals_the_global_batch(self):
        self.check_sync("sync")

    def test_sync_with_buffer_broadcast_equals_the_global_batch(self):
        self.check_sync("sync_broadcast")


class DdpOtherPoliciesTest(unittest.TestCase):
    def check_local_training(self, got):
        model, outputs = train_reference(per_slice=True)
        for rank, g in enumerate(got):
            rows = ddp_cases.rows(rank)
            for step in range(ddp_cases.STEPS):
                torch.testing.assert_close(
                    g["y"][step], outputs[step][rows], **F64,
                    msg=f"step {step} rank {rank}")
            for key, value in model.state_dict().items():
                if not key.endswith(RUNNING):
                    torch.testing.assert_close(g["state"][key], value, **F64,
                                               msg=f"{key} rank {rank}")
        for key in got[0]["state"]:  # settled alike on both ranks
            torch.testing.assert_close(got[0]["state"][key],
                                       got[1]["state"][key], **F64, msg=key)

    def test_local(self):
        got = run("local", "local")
        self.assertEqual([g["settled"] for g in got], [3, 3])
        self.check_local_training(got)

    def test_recal(self):
        got = run("recal", "recal")
        self.assertEqual([g["recalibrated"] for g in got], [2, 2])
        self.check_local_training(got)

    def test_async(self):
        got = run("async", "async", flags=["--staleness=1"])
        for g in got:
            self.assertEqual(g["settled"], 3)
            self.assertTrue(all(torch.isfinite(torch.tensor(g["loss"]))))
            self.assertTrue(all(bool(torch.isfinite(v.double()).all())
                                for v in g["state"].values()))
        for key in got[0]["state"]:  # DDP's parameters, the servers' stats
            torch.testing.assert_close(got[0]["state"][key],
                                       got[1]["state"][key], **F64, msg=key)


if __name__ == "__main__":
    unittest.main()
