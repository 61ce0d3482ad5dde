"""The end of a job on a real cluster (2 shards, 2 workers, sync, 127.0.0.1):
every shard writes a final checkpoint when the last worker leaves, so a
shard SIGKILLed after the job and restarted with the same command serves the
finished run's `bnps_status --digest` and says the job is complete (a
worker started again then has nothing to do and exits 0); and,
without --keep_serving, the servers exit 0 on their own once the job is
complete, and one started again on it keeps serving reads.
"""

import os
import re
import tempfile
import unittest

from tests.restart_cluster import Cluster

# 10 steps with a checkpoint every 4: the last boundary checkpoint is of
# step 8, so only the final checkpoint holds step 10.
STEPS, EVERY = 10, 4


class JobEndTest(unittest.TestCase):
    def finish(self, c):
        c.start()
        self.assertEqual(c.wait_workers(), [0] * c.num_workers, c.logs())

    def test_a_shard_restarted_after_the_job_serves_the_final_state(self):
        with tempfile.TemporaryDirectory() as out:
            c = Cluster(out, steps=STEPS, checkpoint_every=EVERY)
            try:
                self.finish(c)
                code, finished = c.status("--digest")
                self.assertEqual(code, 0, finished)
                self.assertRegex(finished, r"^params sha256 [0-9a-f]{64} step 10$")
                self.assertIn("ckpt-000000000010.bnps", c.checkpoints(1))
                c.kill("server", 1)
                c.start_server(1)
                code, digest = c.status("--digest")
                self.assertEqual((code, digest), (0, finished), c.logs())
                log = c.read_log("server", 1)
                self.assertIn("resumed from the final checkpoint of step 10", log)
                self.assertIn("the job is complete", log)
                code, status = c.status()
                self.assertEqual(code, 0, status)
                self.assertEqual(status.count("job complete: every worker "
                                              "finished"), 2, status)
                self.assertEqual(len(re.findall(r"worker \d: finished", status)),
                                 4, status)
                # A worker started again on the complete job (a supervisor's
                # restart of a process killed on its way out) has nothing to
                # do: it exits 0, saying so.
                c.start_worker(1)
                self.assertEqual(c.wait_workers(), [0, 0], c.logs())
                self.assertIn("bnps_worker 1/2: nothing to do", c.read_log("worker", 1))
                self.assertIn("is complete", c.read_log("worker", 1))
            finally:
                c.stop()

    def test_servers_exit_with_the_job_and_a_restarted_one_serves_reads(self):
        with tempfile.TemporaryDirectory() as out:
            c = Cluster(out, steps=STEPS, checkpoint_every=EVERY,
                        keep_serving=False)
            try:
                self.finish(c)
                self.assertEqual(c.wait_servers(), [0, 0], c.logs())
                for i in range(2):
                    self.assertIn("final checkpoint of step 10 written",
                                  c.read_log("server", i))
                    self.assertIn("exiting (--keep_serving would keep serving "
                                  "reads)", c.read_log("server", i))
                for i in range(2):
                    c.start_server(i)
                code, digest = c.status("--digest")
                self.assertEqual(code, 0, c.logs())
                self.assertRegex(digest, r"^params sha256 [0-9a-f]{64} step 10$")
                # An export of the final state is still possible.
                path = os.path.join(out, "model.safetensors")
                code, said = c.status("--export=" + path)
                self.assertEqual(code, 0, said)
                self.assertIn("of step 10 (the job is complete)", said)
                self.assertGreater(os.path.getsize(path), 1000)
                # Reads do not end it: it serves until stopped.
                self.assertEqual(c.status("--digest"), (0, digest))
                self.assertEqual([s.poll() for s in c.servers], [None, None])
            finally:
                c.stop()


if __name__ == "__main__":
    unittest.main()
