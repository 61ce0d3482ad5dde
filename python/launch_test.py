"""Unit tests of bnps.launch (pure Python: no torch, no servers): the worker
id and count from each launcher's variables, BNPS_* and arguments winning,
and every disagreement between launchers an error naming both variables."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles

import types  # noqa: E402

from bnps.launch import (placement, ray_train_context,  # noqa: E402
                         starts_node_server, trainer_servers)

# torchrun --nnodes=2 --nproc_per_node=4, the process of global rank 6.
TORCHRUN = {"RANK": "6", "WORLD_SIZE": "8", "LOCAL_RANK": "2",
            "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}
# Kubeflow Trainer's torch runtime, node 1 of 2 with 4 processes each.
KUBEFLOW = {"PET_NODE_RANK": "1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "4"}
# srun --ntasks=8 --ntasks-per-node=4, task 6.
SLURM = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_LOCALID": "2"}


def where(env, **kw):
    p = placement(env, **kw)
    return p.worker, p.num_workers, p.local_rank, p.local_world_size


class EachLauncherTest(unittest.TestCase):
    def test_torchrun(self):
        p = placement(TORCHRUN)
        self.assertEqual((p.worker, p.num_workers, p.local_rank,
                          p.local_world_size, p.num_nodes), (6, 8, 2, 4, 2))
        self.assertEqual(p.sources["worker"], "RANK=6")

    def test_kubeflow_one_process_per_pod(self):
        env = {"PET_NODE_RANK": "3", "PET_NNODES": "5",
               "PET_NPROC_PER_NODE": "1"}
        self.assertEqual(where(env), (3, 5, None, 1))
        self.assertEqual(placement(env).num_nodes, 5)

    def test_kubeflow_with_a_local_rank(self):
        env = dict(KUBEFLOW, LOCAL_RANK="2")
        self.assertEqual(where(env), (6, 8, 2, 4))
        self.assertIn("PET_NODE_RANK=1", placement(env).sources["worker"])

    def test_kubeflow_under_torchrun_agrees(self):
        self.assertEqual(where(dict(TORCHRUN, **KUBEFLOW)), (6, 8, 2, 4))

    def test_kubeflow_leaves_torchruns_own_forms_to_torchrun(self):
        env = dict(TORCHRUN, PET_NNODES="1:4", PET_NPROC_PER_NODE="auto")
        self.assertEqual(where(env), (6, 8, 2, 4))

    def test_kubeflow_several_processes_without_a_local_rank(self):
        with self.assertRaisesRegex(ValueError, "no worker id"):
            placement(KUBEFLOW)

    def test_slurm(self):
        self.assertEqual(where(SLURM), (6, 8, 2, None))
        self.assertEqual(placement(SLURM).sources["num_workers"],
                         "SLURM_NTASKS=8")

    def test_srun_starting_torchrun_reads_torchrun(self):
        # srun started one torchrun agent per node: Slurm's task is the
        # agent (task 1 of 2), not this process.
        env = dict(TORCHRUN, SLURM_PROCID="1", SLURM_NTASKS="2",
                   SLURM_LOCALID="0")
        self.assertEqual(where(env), (6, 8, 2, 4))

    def test_agreeing_torch_variables_set_by_hand_under_slurm(self):
        env = dict(SLURM, RANK="6", WORLD_SIZE="8", LOCAL_RANK="2")
        self.assertEqual(where(env), (6, 8, 2, None))


class PrecedenceTest(unittest.TestCase):
    def test_bnps_variables_win_over_the_launchers(self):
        env = dict(TORCHRUN, BNPS_WORKER="1", BNPS_NUM_WORKERS="3")
        p = placement(env)
        self.assertEqual((p.worker, p.num_workers), (1, 3))
        self.assertEqual(p.sources["worker"], "BNPS_WORKER=1")
        self.assertEqual(p.local_rank, 2)  # still torchrun's

    def test_bnps_variables_win_without_reading_disagreeing_launchers(self):
        env = dict(SLURM, RANK="0", WORLD_SIZE="8", BNPS_WORKER="5",
                   BNPS_NUM_WORKERS="8")
        self.assertEqual(where(env)[:2], (5, 8))

    def test_one_bnps_variable_and_the_rest_from_the_launcher(self):
        env = dict(TORCHRUN, BNPS_NUM_WORKERS="8")
        self.assertEqual(where(env)[:2], (6, 8))

    def test_arguments_win_over_everything(self):
        env = dict(TORCHRUN, BNPS_WORKER="1", BNPS_NUM_WORKERS="3")
        p = placement(env, worker=0, num_workers=2)
        self.assertEqual((p.worker, p.num_workers), (0, 2))
        self.assertEqual(p.sources["worker"], "argument")

    def test_nothing_at_all(self):
        with self.assertRaisesRegex(ValueError, "BNPS_WORKER.*RANK"):
            placement({"PATH": "/bin"})


class FakeRayContext:
    """ray.train.get_context()'s answers for worker 5 of 4 x 2 on node 1."""

    def __init__(self, rank=5, size=8, local=1, local_size=4):
        self.answers = dict(get_world_rank=rank, get_world_size=size,
                            get_local_rank=local, get_local_world_size=local_size)

    def __getattr__(self, name):
        if name in self.__dict__.get("answers", {}):
            return lambda: self.answers[name]
        raise AttributeError(name)


class RayTrainTest(unittest.TestCase):
    def test_the_context_alone(self):
        self.assertEqual(where({}, ray_context=FakeRayContext()), (5, 8, 1, 4))
        p = placement({}, ray_context=FakeRayContext())
        self.assertEqual(p.sources["worker"], "Ray Train's get_world_rank()=5")

    def test_agreeing_torch_variables(self):
        env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
               "LOCAL_WORLD_SIZE": "4"}
        self.assertEqual(where(env, ray_context=FakeRayContext()),
                         (5, 8, 1, 4))

    def test_disagreeing_torch_variables(self):
        with self.assertRaisesRegex(ValueError,
                                    "get_world_rank\\(\\)=5.*RANK=4"):
            placement({"RANK": "4", "WORLD_SIZE": "8"},
                      ray_context=FakeRayContext())

    def test_bnps_variables_win(self):
        env = {"BNPS_WORKER": "0", "BNPS_NUM_WORKERS": "2"}
        self.assertEqual(where(env, ray_context=FakeRayContext())[:2], (0, 2))

    def test_the_context_is_read_from_an_imported_ray_train(self):
        saved = sys.modules.get("ray.train")
        try:
            sys.modules.pop("ray.train", None)
            self.assertIsNone(ray_train_context())
            sys.modules["ray.train"] = types.SimpleNamespace(
                get_context=FakeRayContext)
            self.assertIsInstance(ray_train_context(), FakeRayContext)
            # Outside a session Ray's context answers None (or raises).
            sys.modules["ray.train"] = types.SimpleNamespace(
                get_context=lambda: FakeRayContext(size=None))
            self.assertIsNone(ray_train_context())
        finally:
            if saved is None:
                sys.modules.pop("ray.train", None)
            else:
                sys.modules["ray.train"] = saved


class ConflictTest(unittest.TestCase):
    def conflict(self, env, *names):
        with self.assertRaises(ValueError) as cm:
            placement(env)
        for name in names:
            self.assertIn(name, str(cm.exception))
        return str(cm.exception)

    def test_torchrun_and_slurm_disagree_on_the_worker(self):
        msg = self.conflict(dict(SLURM, RANK="5", WORLD_SIZE="8"),
                            "RANK=5", "SLURM_PROCID=6")
        self.assertIn("worker id", msg)

    def test_torchrun_and_slurm_disagree_on_the_count(self):
        self.conflict(dict(SLURM, RANK="6", WORLD_SIZE="4"),
                      "WORLD_SIZE=4", "SLURM_NTASKS=8")

    def test_torchrun_and_slurm_disagree_on_the_local_rank(self):
        # Used only where asked for: the worker id and count agree.
        env = dict(SLURM, RANK="6", WORLD_SIZE="8", LOCAL_RANK="1")
        with self.assertRaisesRegex(ValueError,
                                    "local rank: LOCAL_RANK=1 but "
                                    "SLURM_LOCALID=2"):
            placement(env)

    def test_torchrun_and_kubeflow_disagree_on_the_count(self):
        self.conflict(dict(TORCHRUN, **dict(KUBEFLOW, PET_NNODES="3")),
                      "WORLD_SIZE=8", "PET_NNODES=3 x PET_NPROC_PER_NODE=4")

    def test_torchrun_and_kubeflow_disagree_on_processes_per_node(self):
        env = dict(TORCHRUN, PET_NNODES="4", PET_NPROC_PER_NODE="2")
        self.conflict(env, "LOCAL_WORLD_SIZE=4", "PET_NPROC_PER_NODE=2")

    def test_kubeflow_and_torch_variables_disagree_on_the_worker(self):
        # Not under torchrun's agent: RANK set otherwise (the Training
        # Operator's pod-level RANK, say).
        env = dict(KUBEFLOW, LOCAL_RANK="2", RANK="5", WORLD_SIZE="8")
        self.conflict(env, "RANK=5",
                      "PET_NODE_RANK=1 x PET_NPROC_PER_NODE=4 + LOCAL_RANK=2")

    def test_kubeflow_and_slurm_disagree(self):
        env = {"PET_NODE_RANK": "1", "PET_NNODES": "2",
               "PET_NPROC_PER_NODE": "1", "SLURM_PROCID": "0",
               "SLURM_NTASKS": "2"}
        self.conflict(env, "PET_NODE_RANK=1", "SLURM_PROCID=0")


class NodeServerTest(unittest.TestCase):
    # Kubeflow Trainer, TrainJob "fashion", node 2 of 3.
    TRAINER = {"PET_NNODES": "3", "PET_NPROC_PER_NODE": "2",
               "PET_NODE_RANK": "2", "PET_MASTER_PORT": "29400",
               "PET_MASTER_ADDR": "fashion-node-0-0.fashion"}

    def servers(self, **env):
        return trainer_servers(dict(self.TRAINER, **env))

    def test_trainer_servers_are_the_nodes_dns_names(self):
        known = self.servers()
        self.assertEqual(known.servers, ",".join(
            f"fashion-node-0-{n}.fashion:7000" for n in range(3)))
        self.assertEqual((known.shard, known.num_shards, known.port),
                         (2, 3, 7000))

    def test_trainer_servers_port(self):
        self.assertEqual(
            self.servers(BNPS_NODE_SERVER_PORT="7100").servers.split(",")[0],
            "fashion-node-0-0.fashion:7100")
        self.assertEqual(trainer_servers(self.TRAINER, port=8000).port, 8000)

    def test_trainer_servers_keep_a_longer_domain(self):
        known = self.servers(
            PET_MASTER_ADDR="a-node-0-b-node-0-0.a-node-0-b.ns.svc")
        self.assertEqual(known.servers.split(",")[1],
                         "a-node-0-b-node-0-1.a-node-0-b.ns.svc:7000")

    def test_not_under_trainer(self):
        for drop in ("PET_MASTER_ADDR", "PET_NNODES", "PET_NODE_RANK"):
            with self.subTest(unset=drop):
                env = {k: v for k, v in self.TRAINER.items() if k != drop}
                self.assertIsNone(trainer_servers(env))
        self.assertIsNone(trainer_servers(TORCHRUN))
        # torchrun's elastic form of the node count, or a master that is not
        # Trainer's node 0: the addresses travel over the process group.
        self.assertIsNone(self.servers(PET_NNODES="1:4"))
        for addr in ("10.0.0.7", "fashion-node-0-1.fashion",
                     "fashion-0-0.fashion"):
            with self.subTest(addr=addr):
                self.assertIsNone(self.servers(PET_MASTER_ADDR=addr))

    def test_trainer_node_outside_the_job(self):
        with self.assertRaisesRegex(
                ValueError, r"PET_NODE_RANK=3 is not in \[0, PET_NNODES=3\)"):
            self.servers(PET_NODE_RANK="3")
        with self.assertRaisesRegex(ValueError,
                                    "BNPS_NODE_SERVER_PORT='x'"):
            self.servers(BNPS_NODE_SERVER_PORT="x")

    def test_local_rank_0_starts_the_node_server(self):
        self.assertFalse(starts_node_server(placement(TORCHRUN)))
        self.assertTrue(starts_node_server(
            placement(dict(TORCHRUN, RANK="4", LOCAL_RANK="0"))))
        with self.assertRaisesRegex(ValueError, "no local rank"):
            starts_node_server(
                placement({"BNPS_WORKER": "0", "BNPS_NUM_WORKERS": "2"}))


class BadValueTest(unittest.TestCase):
    def test_a_bad_variable_is_named_with_its_value(self):
        for env, name in (({"RANK": "x", "WORLD_SIZE": "2"}, "$RANK='x'"),
                          ({"SLURM_PROCID": "-1", "SLURM_NTASKS": "2"},
                           "$SLURM_PROCID='-1'"),
                          ({"BNPS_WORKER": "one", "BNPS_NUM_WORKERS": "2"},
                           "$BNPS_WORKER='one'")):
            with self.assertRaises(ValueError) as cm:
                placement(env)
            self.assertIn(name, str(cm.exception))

    def test_worker_outside_the_job(self):
        with self.assertRaisesRegex(ValueError, r"worker 4 \(RANK=4\) is not "
                                    r"in \[0, 4\) \(WORLD_SIZE=4\)"):
            placement({"RANK": "4", "WORLD_SIZE": "4"})

    def test_a_launcher_variable_unused_is_not_parsed(self):
        env = {"BNPS_WORKER": "0", "BNPS_NUM_WORKERS": "1", "RANK": "x"}
        self.assertEqual(where(env)[:2], (0, 1))


if __name__ == "__main__":
    unittest.main()
