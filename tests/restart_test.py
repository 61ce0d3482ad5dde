"""Kills and restarts on a real cluster (2 shards, 2 workers, sync, 127.0.0.1):
a shard server killed with SIGKILL and restarted with the same command, or a
worker killed and restarted (--on_worker_loss=wait), and the job ends with
the same `bnps_status --digest` as an uninterrupted run of the same seed
(also with the workers' --replicas=2 or --layer_pull=true). A
corrupt newest checkpoint is detected and the previous one used.
"""

import os
import tempfile
import time
import unittest

from tests.restart_cluster import Cluster
from tests.sharding import load_tests  # noqa: F401  (unittest's hook: shard_count)


# Long enough that every kill and restart falls mid-job (the first common
# checkpoint comes at step 3), short enough to keep the suite fast.
STEPS = 150


class RestartTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.reference = {}

    def run_cluster(self, out, disrupt=None, **kwargs):
        c = Cluster(out, **{"steps": STEPS, **kwargs})
        try:
            c.start()
            if disrupt:
                disrupt(c)
            codes = c.wait_workers()
            self.assertEqual(codes, [0] * c.num_workers, c.logs())
            return c, c.digest()
        finally:
            c.stop()

    def uninterrupted(self, **kwargs):
        key = tuple(sorted(kwargs.items()))
        if key not in self.reference:
            with tempfile.TemporaryDirectory() as out:
                _, digest = self.run_cluster(out, **kwargs)
            self.assertRegex(digest, rf"^params sha256 [0-9a-f]{{64}} step {STEPS}$")
            self.reference[key] = digest
        return self.reference[key]

    def test_uninterrupted_runs_agree(self):
        with tempfile.TemporaryDirectory() as out:
            _, digest = self.run_cluster(out)
        self.assertEqual(digest, self.uninterrupted())

    def test_server_killed_and_restarted(self):
        def kill_server_1(c):
            self.assertTrue(c.wait_for_common_checkpoint(), c.logs())
            c.kill("server", 1)
            c.start_server(1)

        with tempfile.TemporaryDirectory() as out:
            c, digest = self.run_cluster(out, disrupt=kill_server_1)
            log = c.read_log("server", 1)
            self.assertIn("resumed from step", log)
            self.assertIn("rolled back to step", log)
            for w in range(2):
                self.assertIn("the job rolled back to step", c.read_log("worker", w))
        self.assertEqual(digest, self.uninterrupted())

    def assert_server_kill_recovered(self, server, flags, reference_flags):
        """Kills `server` once every shard has a checkpoint and restarts it:
        every worker rolls back, and the job ends on the digest of the
        uninterrupted run with `reference_flags`."""
        def kill(c):
            self.assertTrue(c.wait_for_common_checkpoint(), c.logs())
            c.kill("server", server)
            c.start_server(server)

        with tempfile.TemporaryDirectory() as out:
            c, digest = self.run_cluster(out, disrupt=kill, **flags)
            for w in range(2):
                self.assertIn("the job rolled back to step",
                              c.read_log("worker", w))
        self.assertEqual(digest, self.uninterrupted(**reference_flags))

    def test_server_killed_under_workers_with_replicas(self):
        # Each worker drives 2 model replicas (co-located aggregation): the
        # failed step is recovered like any other, and the job ends on the
        # digest of its uninterrupted run.
        flags = {"extra_worker_flags": ("--replicas=2",)}
        self.assert_server_kill_recovered(0, flags, reference_flags=flags)

    def test_server_killed_under_workers_pulling_layer_by_layer(self):
        # --layer_pull: a rollback that lands while a step's pull streams is
        # recovered like any other, and the job ends on the very digest of
        # the uninterrupted run that pulls everything before each pass.
        flags = {"extra_worker_flags": ("--layer_pull=true",)}
        self.assert_server_kill_recovered(1, flags, reference_flags={})

    def test_worker_killed_and_restarted(self):
        def kill_worker_1(c):
            self.assertTrue(c.wait_for_common_checkpoint(), c.logs())
            c.kill("worker", 1)
            c.start_worker(1)

        with tempfile.TemporaryDirectory() as out:
            c, digest = self.run_cluster(out, disrupt=kill_worker_1,
                                         worker_loss="wait")
            self.assertIn("takes the place of the old one",
                          c.read_log("server", 0))
            self.assertIn("the job rolled back to step", c.read_log("worker", 0))
        self.assertEqual(digest, self.uninterrupted(worker_loss="wait"))

    def test_corrupt_newest_checkpoint_falls_back(self):
        def kill_and_corrupt(c):
            self.assertTrue(c.wait_for_common_checkpoint(), c.logs())
            # Two checkpoints, so that there is a previous one to fall back to.
            deadline = time.time() + 60
            while len(c.checkpoints(1)) < 2 and time.time() < deadline:
                time.sleep(0.01)
            self.assertGreaterEqual(len(c.checkpoints(1)), 2, c.logs())
            c.kill("server", 1)
            newest = os.path.join(c.checkpoint_dir(1), c.checkpoints(1)[-1])
            with open(newest, "r+b") as f:
                f.seek(-5, os.SEEK_END)
                byte = f.read(1)
                f.seek(-5, os.SEEK_END)
                f.write(bytes([byte[0] ^ 0xFF]))
            c.bad_file = newest
            c.start_server(1)

        with tempfile.TemporaryDirectory() as out:
            c, digest = self.run_cluster(out, disrupt=kill_and_corrupt)
            log = c.read_log("server", 1)
            self.assertIn(f"checkpoint {c.bad_file} is bad (checkpoint "
                          f"{c.bad_file}: checksum mismatch); set aside as "
                          f"{c.bad_file}.bad; trying the previous one", log)
            self.assertIn("resumed from step", log)
        self.assertEqual(digest, self.uninterrupted())


if __name__ == "__main__":
    unittest.main()
