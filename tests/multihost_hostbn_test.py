"""Per-host BN aggregation on the test bed (tools/testbed): 2 shard servers
on hosts 0 and 1, 2 worker hosts with 2 workers each, every worker's BN
traffic through its host's aggregator (bnps_host_bn on the host's
127.0.0.1, --bn_host_aggregator), 200 us links. Sync policy, synthetic data,
a fixed seed: the job must end on the digest of the same 4-worker job on
127.0.0.1 without aggregators (the flat path).

Needs root for the namespaces: skips, saying why, without.
"""

import os
import subprocess
import tempfile
import unittest

from tests.multihost_cluster import BedCluster, ports
from tests.restart_cluster import RUNFILES, Cluster
from tools.testbed import testbed

HOST_BN = os.path.join(RUNFILES, "hostbn", "bnps_host_bn")
STEPS = int(os.environ.get("BNPS_MULTIHOST_STEPS", "100"))
WHY = testbed.unavailable()
SERVERS, WORKER_HOSTS = [0, 1], [2, 2, 3, 3]
AGGREGATOR = "127.0.0.1:7200"


@unittest.skipIf(WHY, f"no test bed here: {WHY}")
class MultihostHostBnTest(unittest.TestCase):
    def test_two_hosts_of_two_workers_through_aggregators_end_on_the_flat_bits(self):
        with tempfile.TemporaryDirectory() as out:
            flat = Cluster(out, workers=4, steps=STEPS)
            try:
                flat.start()
                self.assertEqual(flat.wait_workers(), [0] * 4, flat.logs())
                reference = flat.digest()
            finally:
                flat.stop()
        self.assertRegex(reference,
                         rf"^params sha256 [0-9a-f]{{64}} step {STEPS}$")

        with tempfile.TemporaryDirectory() as out, testbed.Bed(4) as bed:
            links = bed.links(clients=sorted(set(WORKER_HOSTS)),
                              servers=SERVERS, ports=ports(len(SERVERS)),
                              rtt_us=200)
            aggregators = []
            for h in sorted(set(WORKER_HOSTS)):
                log = open(os.path.join(out, f"host_bn{h}.log"), "w")
                self.addCleanup(log.close)
                aggregators.append(bed.popen(h, [
                    HOST_BN, "--host=127.0.0.1", "--port=7200", "--workers=2"],
                    stdout=log, stderr=subprocess.STDOUT))
            c = BedCluster(out, bed, links, SERVERS, WORKER_HOSTS, 0,
                           steps=STEPS, extra_worker_flags=(
                               f"--bn_host_aggregator={AGGREGATOR}",))
            try:
                c.start()
                self.assertEqual(c.wait_workers(timeout=180), [0] * 4, c.logs())
                digest = c.digest()
            finally:
                c.stop()
                for p in aggregators:
                    p.kill()
                    p.wait()
            logs = [c.read_log("worker", w) for w in range(4)]
        self.assertEqual(digest, reference)
        for w, log in enumerate(logs):
            # Both shards' BN traffic went through the host's aggregator and
            # never fell back to the gRPC stream.
            for shard in range(2):
                self.assertIn(f"BN over TCP to shard {shard} (10.77.1.{shard + 1}"
                              f":700{shard}), port 710{shard} through "
                              f"{AGGREGATOR}", log)
            self.assertNotIn("takes the gRPC stream", log, f"worker {w}")


if __name__ == "__main__":
    unittest.main()
