"""Chaos on a real cluster (127.0.0.1): 2 shard servers and 3 workers under
sync with --on_worker_loss=wait; processes killed with SIGKILL at random
moments and restarted with the same command, as a supervisor would. The job
must finish with the same `bnps_status --digest` as an uninterrupted run of
the same seed.

Bounded: at most BNPS_CHAOS_KILLS kills (default 3 in 300 steps, the short
version that runs in `bazel test //...`; its kills land in the first 40 or
so steps), each after the job made progress (a new checkpoint) since the
last one, and the whole run within BNPS_CHAOS_TIMEOUT_S.
The longer version is one command (docs/reliability.md):

  BNPS_CHAOS_KILLS=20 BNPS_CHAOS_STEPS=3000 bazel test //tests:chaos_test \\
      --test_env=BNPS_CHAOS_KILLS --test_env=BNPS_CHAOS_STEPS \\
      --test_output=all --test_timeout=900

The random seed is printed (and taken from BNPS_CHAOS_SEED if set), so a
failing sequence of kills can be replayed.
"""

import os
import random
import tempfile
import time
import unittest

from tests.restart_cluster import Cluster
from tests.sharding import load_tests  # noqa: F401  (unittest's hook: shard_count)

KILLS = int(os.environ.get("BNPS_CHAOS_KILLS", "3"))
STEPS = int(os.environ.get("BNPS_CHAOS_STEPS", "300"))
TIMEOUT_S = float(os.environ.get("BNPS_CHAOS_TIMEOUT_S", "600"))
SEED = int(os.environ.get("BNPS_CHAOS_SEED", str(random.SystemRandom().randrange(1 << 30))))


def newest_checkpoint(c, shard):
    names = c.checkpoints(shard)
    return names[-1] if names else None


def kill_and_restart(c, rng, kills, deadline):
    """Up to KILLS random SIGKILLs of c's processes, each restarted at once
    and each after a new checkpoint of shard 0 (the job went on)."""
    last = None
    while len(kills) < KILLS and time.time() < deadline:
        if all(w.poll() is not None for w in c.workers):
            return  # the job finished first
        newest = newest_checkpoint(c, 0)
        if newest is None or newest == last:
            time.sleep(0.02)
            continue
        time.sleep(rng.uniform(0, 0.3))
        kind = rng.choice(["server", "worker"])
        i = rng.randrange(c.num_servers if kind == "server" else c.num_workers)
        procs = c.servers if kind == "server" else c.workers
        if procs[i].poll() is not None:
            continue  # a worker that finished
        c.kill(kind, i)
        kills.append(f"{kind}{i}@{newest}")
        (c.start_server if kind == "server" else c.start_worker)(i)
        last = newest_checkpoint(c, 0)


class ChaosTest(unittest.TestCase):
    def cluster(self, out, **kwargs):
        return Cluster(out, servers=2, workers=3, steps=STEPS, checkpoint_every=5,
                       worker_loss="wait", **kwargs)

    def test_async_applies_every_push_once(self):
        # Under async the runs differ (arrival order), but every
        # (worker, step, key) is applied exactly once: the shards' applied
        # pushes equal the workers' own count, steps x workers x keys.
        rng = random.Random(SEED + 1)
        with tempfile.TemporaryDirectory() as out:
            c = self.cluster(out, policy="async", staleness=2)
            kills = []
            deadline = time.time() + TIMEOUT_S
            try:
                c.start()
                kill_and_restart(c, rng, kills, deadline)
                codes = c.wait_workers(timeout=max(1, deadline - time.time()))
                print(f"chaos (async): survived {len(kills)} kills: "
                      f"{', '.join(kills)}", flush=True)
                self.assertEqual(codes, [0, 0, 0], f"kills {kills}\n" + c.logs())
                params, applied, min_version = c.pushes()
            finally:
                c.stop()
            self.assertGreater(len(kills), 0, "the job finished before any kill")
            self.assertGreater(params, 0)
            # Each push updates its key once: every key saw every push.
            self.assertEqual(min_version, STEPS * 3, f"seed {SEED + 1}, kills {kills}")
            self.assertEqual(applied, STEPS * 3 * params,
                             f"seed {SEED + 1}, kills {kills}")

    def test_sync_survives_random_kills_bit_identically(self):
        rng = random.Random(SEED)
        print(f"chaos: seed {SEED}, up to {KILLS} kills, {STEPS} steps", flush=True)
        with tempfile.TemporaryDirectory() as out:
            c = self.cluster(os.path.join(out, "reference"))
            os.makedirs(c.out)
            try:
                c.start()
                self.assertEqual(c.wait_workers(), [0, 0, 0], c.logs())
                reference = c.digest()
            finally:
                c.stop()
            self.assertRegex(reference, rf"^params sha256 [0-9a-f]{{64}} step {STEPS}$")

            c = self.cluster(os.path.join(out, "chaos"))
            os.makedirs(c.out)
            kills = []
            deadline = time.time() + TIMEOUT_S
            try:
                c.start()
                kill_and_restart(c, rng, kills, deadline)
                codes = c.wait_workers(timeout=max(1, deadline - time.time()))
                print(f"chaos: survived {len(kills)} kills: {', '.join(kills)}",
                      flush=True)
                self.assertEqual(codes, [0, 0, 0], f"kills {kills}\n" + c.logs())
                digest = c.digest()
            finally:
                c.stop()
            self.assertGreater(len(kills), 0, "the job finished before any kill")
            self.assertEqual(digest, reference, f"seed {SEED}, kills {kills}")


if __name__ == "__main__":
    unittest.main()
