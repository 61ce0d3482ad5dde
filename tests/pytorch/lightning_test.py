"""bnps.lightning's plugin inside PyTorch Lightning's own Trainer: two
ranks of DDP over gloo on the CPU (launched from outside, as torchrun
would) train lightning_cases' job under sync with the plugin in
`plugins=[...]`; each rank's network after the plugin's revert, and the
checkpoint Lightning wrote under the plugin loaded (strict) into a plain
network, equal one process with torch's BatchNorm on the global batches
(float64, 1e-6), and revert gave back the layers' own classes. Needs the
`lightning` package (tools/wheel_test.sh installs it beside torch 2.x);
skips, saying so, without it."""

import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles
sys.path.insert(0, HERE)
sys.path.append(os.path.join(HERE, "..", "..", "python"))  # a checkout
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402

import lightning_cases as cases  # noqa: E402
from bnps.cluster import LocalCluster  # noqa: E402

WORKER = os.path.join(HERE, "lightning_worker.py")
TOL = dict(rtol=1e-6, atol=1e-6)
MISSING = None if importlib.util.find_spec("lightning") else (
    "no `lightning` package here (tools/wheel_test.sh runs this test with "
    "it)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pythonpath():
    """The package as this process found it, for the ranks."""
    import bnps
    here = os.path.dirname(os.path.dirname(os.path.abspath(bnps.__file__)))
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p]
    return os.pathsep.join([here] + rest)


@unittest.skipIf(MISSING, MISSING or "")
class LightningPluginTest(unittest.TestCase):
    def test_ddp_with_the_plugin_is_torch_on_the_global_batch(self):
        with LocalCluster(num_servers=1, num_workers=cases.WORKERS,
                          policy="sync") as cluster, \
                tempfile.TemporaryDirectory() as out:
            port = free_port()
            procs = []
            for rank in range(cases.WORKERS):
                env = cluster.worker_env(rank)
                # The plugin takes the worker id and count from the process
                # group, as a Lightning user's job would.
                env.pop("BNPS_WORKER", None)
                env.pop("BNPS_NUM_WORKERS", None)
                env.update(PYTHONPATH=pythonpath(), OMP_NUM_THREADS="1",
                           LOCAL_RANK=str(rank), NODE_RANK="0",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                procs.append(subprocess.Popen(
                    [sys.executable, WORKER, out], env=env,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True))
            logs = []
            for p in procs:
                try:
                    logs.append(p.communicate(timeout=300)[0])
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.kill()
                    raise AssertionError("a Lightning rank hung") from None
            for rank, p in enumerate(procs):
                self.assertEqual(p.returncode, 0,
                                 f"rank {rank}:\n{logs[rank][-4000:]}")
            ref = cases.reference()
            for rank in range(cases.WORKERS):
                got = torch.load(os.path.join(out, f"rank{rank}.pt"))
                self.assertEqual(got["layers"], ["BatchNorm2d", "BatchNorm1d"])
                self.assertEqual(sorted(got["state"]), sorted(ref))
                for key, value in ref.items():
                    torch.testing.assert_close(got["state"][key], value,
                                               **TOL, msg=f"rank {rank} {key}")
            ckpt = torch.load(os.path.join(out, "trained.ckpt"),
                              weights_only=False)
            plain = cases.net()
            plain.load_state_dict(
                {k[len("net."):]: v for k, v in ckpt["state_dict"].items()},
                strict=True)
            for key, value in ref.items():
                torch.testing.assert_close(plain.state_dict()[key], value,
                                           **TOL, msg=f"checkpoint {key}")


if __name__ == "__main__":
    unittest.main()
