"""bnps.torch under Ray Train: a local Ray cluster of a head and two more
nodes, a TorchTrainer of 4 CPU workers, each opening its bnps connection
from Ray Train's context alone (no worker id or count given) and training
lightning_cases' network (4 ranks) with DDP and bnps SyncBatchNorm under
sync:

- every worker's network equals one process with torch's BatchNorm on the
  global batches (float64, 1e-6), and bnps_status reads the job complete;
- a worker that dies mid-run (os._exit at its second step) fails the
  trainer, and the servers name it: bnps_status shows that worker (by its
  Ray world rank) lost and no other.

Needs `ray[train]` (tools/wheel_test.sh installs it beside torch 2.x); skips,
saying so, without it."""

import importlib.util
import json
import os
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

import lightning_cases  # noqa: E402
from bnps import cluster as bnps_cluster  # noqa: E402

WORKERS = 4
TOL = dict(rtol=1e-6, atol=1e-6)
MISSING = None if importlib.util.find_spec("ray") and \
    importlib.util.find_spec("ray.train") else (
        "no `ray[train]` here (tools/wheel_test.sh runs this test with it)")


def train_loop(config):
    """One Ray Train worker: bnps from Ray's context, DDP, STEPS steps."""
    import os
    import sys
    sys.path.insert(0, config["here"])
    import torch
    import torch.distributed as dist
    import bnps.torch
    from bnps import layer_sync
    import lightning_cases as cases
    torch.set_num_threads(1)
    conn = bnps.torch.init(servers=config["servers"], set_default=False,
                           connect_timeout_s=60.0, rpc_timeout_s=60.0)
    rank = conn.worker
    model = bnps.torch.convert_sync_batchnorm(cases.net(), connection=conn)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, broadcast_buffers=False)
    opt = torch.optim.SGD(ddp.parameters(), lr=cases.LR)
    x, y = cases.data(config["workers"])
    mine = cases.rank_slice(rank, config["workers"])
    for k in range(cases.STEPS):
        if rank == config.get("die") and k == 1:
            os._exit(3)
        rows = mine[k * cases.BATCH:(k + 1) * cases.BATCH]
        with conn.step():
            opt.zero_grad()
            cases.loss(ddp, x[rows], y[rows]).backward()
            opt.step()
    torch.save({"state": layer_sync.revert(model).state_dict(),
                "ray_rank": dist.get_rank()},
               os.path.join(config["out"], f"rank{rank}.pt"))
    conn.finish()


def status(servers):
    binary = bnps_cluster._find_binary(
        "bnps_status", "tools", "BNPS_STATUS_BIN", None, "//:bnps_status")
    if not isinstance(servers, str):
        servers = ",".join(servers)
    out = subprocess.run([binary, "--servers=" + servers, "--json"],
                         capture_output=True, text=True, timeout=60)
    servers = json.loads(out.stdout)["servers"]
    for s in servers:
        if "status" not in s:
            raise AssertionError(f"bnps_status: {s}\n{out.stderr}")
    return servers


@unittest.skipIf(MISSING, MISSING or "")
class RayTrainTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import ray
        from ray.cluster_utils import Cluster
        cls.ray = Cluster(initialize_head=True,
                          head_node_args={"num_cpus": 2})
        for _ in range(2):
            cls.ray.add_node(num_cpus=2)
        import bnps
        package = os.path.dirname(os.path.dirname(
            os.path.abspath(bnps.__file__)))
        env = {k: v for k, v in os.environ.items()
               if k.startswith("BNPS_") and k not in ("BNPS_WORKER",
                                                      "BNPS_NUM_WORKERS")}
        env["PYTHONPATH"] = os.pathsep.join(
            [package] + [p for p in os.environ.get("PYTHONPATH", "").split(
                os.pathsep) if p])
        env["OMP_NUM_THREADS"] = "1"
        ray.init(address=cls.ray.address, runtime_env={"env_vars": env},
                 include_dashboard=False, log_to_driver=False)

    @classmethod
    def tearDownClass(cls):
        import ray
        ray.shutdown()
        cls.ray.shutdown()

    def fit(self, servers, out, **extra):
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
        config = {"servers": servers, "out": out, "here": HERE,
                  "workers": WORKERS, **extra}
        trainer = TorchTrainer(
            train_loop, train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False),
            run_config=RunConfig(storage_path=os.path.join(out, "ray"),
                                 name="bnps"))
        return trainer.fit()

    def test_four_workers_equal_torch_on_the_global_batch(self):
        ref = lightning_cases.reference(WORKERS)
        with bnps_cluster.LocalCluster(num_servers=2, num_workers=WORKERS,
                                       policy="sync") as c, \
                tempfile.TemporaryDirectory() as out:
            self.fit(c.servers, out)
            for rank in range(WORKERS):
                got = torch.load(os.path.join(out, f"rank{rank}.pt"))
                self.assertEqual(got["ray_rank"], rank)
                for key, value in ref.items():
                    torch.testing.assert_close(
                        got["state"][key], value, **TOL,
                        msg=f"worker {rank} {key}")
            for s in status(c.servers):
                self.assertTrue(s["status"]["job_complete"], s)

    def test_a_killed_worker_is_named_by_its_rank(self):
        with bnps_cluster.LocalCluster(
                num_servers=1, num_workers=WORKERS, policy="sync",
                server_flags=["--heartbeat_timeout_ms=2000"]) as c, \
                tempfile.TemporaryDirectory() as out:
            with self.assertRaises(Exception):
                self.fit(c.servers, out, die=2)
            import time
            deadline = time.monotonic() + 30
            while True:
                workers = status(c.servers)[0]["status"]["workers"]
                lost = [w["worker"] for w in workers
                        if w["registered"] and not w["live"]]
                if lost or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            self.assertIn(2, lost, workers)
            self.assertIn("worker 2 was lost", c.server_log(0))


if __name__ == "__main__":
    unittest.main()
