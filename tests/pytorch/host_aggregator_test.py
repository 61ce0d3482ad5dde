"""bnps.torch through a host's BN aggregator (BNPS_BN_HOST_AGGREGATOR, the
wheel's bnps-host-bn): two workers of a sync job, each in a thread of its
own with a connection of its own, send their BN traffic through one
bnps_host_bn; the layer's outputs, gradients and running statistics equal
torch.nn.BatchNorm2d on the concatenated batch (float64), and the
aggregator's metrics show every round crossing to the shard as one frame
for both. A malformed aggregator address stops init. Real bnps_server and
bnps_host_bn processes on 127.0.0.1."""

import os
import re
import socket
import subprocess
import sys
import threading
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                             "python"))  # run from a checkout: torch_or_debian.py
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402


import bnps  # noqa: E402
import bnps.torch  # noqa: E402
from bnps.cluster import (LocalCluster, find_host_bn_binary,  # noqa: E402
                          parse_listening)

STEPS = 3
F64 = dict(rtol=1e-9, atol=1e-9)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def counter(text, series):
    m = re.search(r"^%s (\d+)$" % re.escape(series), text, re.M)
    return int(m.group(1)) if m else None


class HostAggregatorTest(unittest.TestCase):
    def setUp(self):
        self.saved = os.environ.pop("BNPS_BN_HOST_AGGREGATOR", None)
        self.cluster = LocalCluster(num_servers=1, num_workers=2,
                                    job="agg").start()
        self.metrics_port = free_port()
        self.aggregator = subprocess.Popen(
            [find_host_bn_binary(), "--host=127.0.0.1", "--port=0",
             "--workers=2",
             f"--metrics_port={self.metrics_port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.address = None
        for line in self.aggregator.stdout:
            self.address = parse_listening(line)
            if self.address:
                break
        self.assertIsNotNone(self.address, "bnps_host_bn did not start")

    def tearDown(self):
        self.aggregator.terminate()
        self.aggregator.wait(timeout=30)
        self.aggregator.stdout.close()
        self.cluster.stop()
        os.environ.pop("BNPS_BN_HOST_AGGREGATOR", None)
        if self.saved is not None:
            os.environ["BNPS_BN_HOST_AGGREGATOR"] = self.saved

    def test_two_workers_through_the_aggregator_equal_the_global_batch(self):
        os.environ["BNPS_BN_HOST_AGGREGATOR"] = self.address
        g = torch.Generator().manual_seed(3)
        batches = [(torch.randn(8, 4, 3, 3, generator=g, dtype=torch.float64)
                    * 5 + 2) for _ in range(STEPS)]
        got, errors = {}, []

        def worker(w):
            try:
                with bnps.torch.init(servers=self.cluster.servers, worker=w,
                                     num_workers=2, job="agg",
                                     set_default=False) as connection:
                    bn = bnps.torch.SyncBatchNorm(
                        4, name="bn", connection=connection).double()
                    outs, grads = [], []
                    for x in batches:
                        part = x[4 * w:4 * w + 4].clone().requires_grad_()
                        y = bn(part)
                        (y * y).sum().backward()
                        outs.append(y.detach())
                        grads.append(part.grad)
                    got[w] = (outs, grads, bn.running_mean.clone(),
                              bn.running_var.clone())
                    connection.finish()
            except Exception as e:  # reported by the main thread
                errors.append(f"worker {w}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=worker, args=(w,))
                   for w in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        self.assertEqual(errors, [])
        ref = torch.nn.BatchNorm2d(4).double()
        for step, x in enumerate(batches):
            whole = x.clone().requires_grad_()
            y = ref(whole)
            (y * y).sum().backward()
            for w in (0, 1):
                torch.testing.assert_close(got[w][0][step],
                                           y.detach()[4 * w:4 * w + 4], **F64)
                torch.testing.assert_close(got[w][1][step],
                                           whole.grad[4 * w:4 * w + 4], **F64)
        for w in (0, 1):
            torch.testing.assert_close(got[w][2], ref.running_mean, **F64)
            torch.testing.assert_close(got[w][3], ref.running_var, **F64)
        with urllib.request.urlopen(
                f"http://127.0.0.1:{self.metrics_port}/metrics",
                timeout=10) as r:
            text = r.read().decode()
        up = counter(text, 'bnps_host_bn_frames_total{direction="to_shards"}')
        down = counter(text,
                       'bnps_host_bn_frames_total{direction="from_workers"}')
        # A forward and a backward exchange a step, for both in one frame.
        self.assertGreaterEqual(up, 2 * STEPS)
        self.assertEqual(down, 2 * up)

    def test_a_malformed_address_stops_init(self):
        os.environ["BNPS_BN_HOST_AGGREGATOR"] = "no-port"
        with self.assertRaisesRegex(ValueError, "bn_host_aggregator"):
            bnps.torch.init(servers=self.cluster.servers, worker=0,
                            num_workers=2, job="agg", set_default=False)


if __name__ == "__main__":
    unittest.main()
