"""A bnps.torch process's Prometheus metrics (init(metrics_port=...) or
BNPS_METRICS_PORT): served over HTTP from the connection on, they count
every BN call of the layers, forward and backward, by layer, whichever path
the layer takes (the native float32 step, the generic float64 one, the
exchanges queued on the stream), and promtool accepts them; the variable
adds the process's LOCAL_RANK; a bad value stops init before it connects, a
port in use with the address in the error. Real bnps_server shards on
127.0.0.1."""

import os
import re
import shutil
import socket
import subprocess
import sys
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                             "python"))  # run from a checkout: torch_or_debian.py
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402


import bnps  # noqa: E402
import bnps.torch  # noqa: E402
from bnps.cluster import LocalCluster  # noqa: E402

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
               "BNPS_METRICS_PORT", "BNPS_METRICS_ADDRESS")


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=10) as r:
        return r.read().decode()


def calls(text, layer, phase):
    """The count of bnps_worker_bn_round_trip_seconds{layer, phase}."""
    m = re.search(r'^bnps_worker_bn_round_trip_seconds_count\{layer="%s",'
                  r'phase="%s"\} (\d+)$' % (re.escape(layer), phase), text,
                  re.M)
    return int(m.group(1)) if m else 0


def free_port_pair():
    """A port P with P and P + 1 free just now."""
    for _ in range(20):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", p + 1))
                except OSError:
                    continue
            return p
    raise RuntimeError("no two free ports in a row")


class MetricsTest(unittest.TestCase):
    def setUp(self):
        self.saved = {k: os.environ.pop(k, None) for k in LAUNCH_VARS}
        self.cluster = LocalCluster(num_servers=2, num_workers=1,
                                    job="metrics").start()

    def tearDown(self):
        self.cluster.stop()
        for k, v in self.saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v

    def connect(self, **kwargs):
        return bnps.torch.init(servers=self.cluster.servers, worker=0,
                               num_workers=1, job="metrics",
                               set_default=False, **kwargs)

    def test_every_bn_call_of_every_path_is_counted(self):
        with self.connect(metrics_port=0) as connection:
            port = connection.metrics_port
            self.assertIsInstance(port, int)
            self.assertGreater(port, 0)
            layers = {
                # float32 on the CPU: the native step
                "native": (torch.float32, False),
                # float64: the generic path, and queued on the stream
                "generic": (torch.float64, False),
                "queued": (torch.float64, True),
            }
            steps = 3
            for name, (dtype, queued) in layers.items():
                connection.stream_exchange = queued
                bn = bnps.torch.SyncBatchNorm(3, name=name,
                                              connection=connection)
                bn.to(dtype)
                for _ in range(steps):
                    x = torch.randn(4, 3, 2, 2, dtype=dtype,
                                    requires_grad=True)
                    bn(x).square().sum().backward()
                connection.drain_exchanges()
            connection.stream_exchange = False
            text = scrape(port)
            for name in layers:
                self.assertEqual(calls(text, name, "forward"), steps, name)
                self.assertEqual(calls(text, name, "backward"), steps, name)
            # The same series without HTTP.
            text = connection.client.metrics_text()
            self.assertEqual(calls(text, "queued", "backward"), steps)
            if os.path.exists(PROMTOOL):
                check = subprocess.run([PROMTOOL, "check", "metrics"],
                                       input=text, capture_output=True,
                                       text=True)
                self.assertEqual(check.returncode, 0,
                                 check.stdout + check.stderr)
            with self.assertRaises(bnps.FailedPrecondition):
                connection.client.serve_metrics("127.0.0.1", 0)

    def test_the_variable_adds_the_local_rank(self):
        base = free_port_pair()
        os.environ.update(BNPS_METRICS_PORT=str(base), RANK="0",
                          WORLD_SIZE="1", LOCAL_RANK="1",
                          LOCAL_WORLD_SIZE="2")
        # The id and count from the arguments, the metrics' port offset
        # from torchrun's LOCAL_RANK.
        with self.connect() as connection:
            self.assertEqual(connection.metrics_port, base + 1)
            self.assertIn("bnps_worker_retries_total", scrape(base + 1))

    def test_a_port_in_use_or_a_bad_variable_stops_init(self):
        os.environ["BNPS_METRICS_PORT"] = "ninety"
        # Before connecting: nothing registered.
        with self.assertRaisesRegex(ValueError, "BNPS_METRICS_PORT"):
            self.connect()
        del os.environ["BNPS_METRICS_PORT"]
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", 0))
            busy.listen()
            port = busy.getsockname()[1]
            with self.assertRaises(bnps.Unavailable) as e:
                self.connect(metrics_port=port)
            self.assertIn(str(port), str(e.exception))

if __name__ == "__main__":
    unittest.main()
