"""bnps.torch.init(start_local_server=True) in one process (a gloo group of
one, as on a one-process node): it starts the node's bnps_server, connects,
trains a layer through it, and close() stops the server; a server that
fails to start is a RuntimeError carrying its output; under Kubeflow
Trainer's variables the server is the node's shard at the fixed port and the
servers are the nodes' derived names; the processes and the node's server
serve metrics on ports of their own; node_aggregator=True starts the node's
BN aggregator, given the servers' hosts (--shards), which then carries the BN
traffic. The multi-node layout runs in
//examples/pytorch:torchrun_test."""

import os
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.getcwd(), "python"))  # Bazel runfiles
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                             "python"))  # run from a checkout: torch_or_debian.py
import torch_or_debian  # noqa: F401,E402  (first: torch, or Debian's python3)
import torch  # noqa: E402


import torch.distributed as dist  # noqa: E402

import bnps.torch  # noqa: E402
from bnps import launch  # noqa: E402
from bnps.torch import node_server  # noqa: E402

ENV = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}


_NODE_AGGREGATOR = """
import os, sys, torch, torch.distributed as dist
import bnps.torch
dist.init_process_group("gloo", init_method="file://" + sys.argv[1] + "/s",
                        rank=0, world_size=1)
connection = bnps.torch.init(start_local_server=True, node_aggregator=True,
                             job="node-agg")
print("aggregator", connection.node_server.aggregator, flush=True)
bn = bnps.torch.SyncBatchNorm(3, name="bn", connection=connection)
bn(torch.randn(4, 3, 2, 2, requires_grad=True)).sum().backward()
hub = connection.node_server.aggregator_process.proc
connection.close()
print("stopped", hub.poll() is not None, flush=True)
dist.destroy_process_group()
"""


class NodeServerTest(unittest.TestCase):
    def setUp(self):
        self.saved = {k: os.environ.get(k) for k in ENV}
        os.environ.update(ENV)
        self.store_dir = tempfile.TemporaryDirectory()
        dist.init_process_group(
            "gloo", init_method="file://" + os.path.join(
                self.store_dir.name, "store"), rank=0, world_size=1)

    def tearDown(self):
        dist.destroy_process_group()
        self.store_dir.cleanup()
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v

    def test_starts_uses_and_stops_the_nodes_server(self):
        connection = bnps.torch.init(start_local_server=True, policy="sync",
                                     job="node-test")
        server = connection.node_server.process
        self.assertEqual(connection.node_server.servers, server.address)
        self.assertTrue(server.address.startswith("127.0.0.1:"))
        self.assertEqual((connection.worker, connection.num_workers), (0, 1))
        self.assertEqual(connection.placement.sources["worker"], "RANK=0")
        self.assertEqual(connection.config["policy"], "sync")
        bn = bnps.torch.SyncBatchNorm(3, name="bn", connection=connection)
        x = torch.randn(4, 3, 2, 2, requires_grad=True)
        bn(x).sum().backward()  # a forward and a backward exchange
        self.assertEqual(int(bn.num_batches_tracked), 1)
        proc = server.proc
        connection.close()
        self.assertIsNotNone(proc.poll(), "the server outlived close()")
        self.assertIsNone(connection.node_server)

    def test_the_processes_and_the_nodes_server_have_metrics_of_their_own(self):
        # BNPS_METRICS_PORT is the process's own (plus LOCAL_RANK 0): the
        # node's server does not inherit it (it would take the same port),
        # and serves on BNPS_NODE_SERVER_METRICS_PORT, where that is set.
        for with_server in (False, True):
            with self.subTest(server_metrics=with_server):
                self.check_metrics(with_server)

    def check_metrics(self, with_server):
        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        mine, servers = ports
        keys = ("BNPS_METRICS_PORT", "BNPS_NODE_SERVER_METRICS_PORT")
        saved = {k: os.environ.get(k) for k in keys}
        os.environ["BNPS_METRICS_PORT"] = str(mine)
        if with_server:
            os.environ["BNPS_NODE_SERVER_METRICS_PORT"] = str(servers)
        try:
            connection = bnps.torch.init(start_local_server=True,
                                         job="node-metrics")
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None)
                if v is not None:
                    os.environ[k] = v
        try:
            self.assertEqual(connection.metrics_port, mine)
            bn = bnps.torch.SyncBatchNorm(3, name="bn", connection=connection)
            bn(torch.randn(4, 3, 2, 2)).sum().backward()
            with urllib.request.urlopen(f"http://127.0.0.1:{mine}/metrics",
                                        timeout=10) as r:
                self.assertIn('bnps_worker_bn_round_trip_seconds_count{layer='
                              '"bn",phase="forward"} 1', r.read().decode())
            if with_server:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{servers}/metrics",
                        timeout=10) as r:
                    self.assertIn("bnps_server_requests_total",
                                  r.read().decode())
        finally:
            connection.close()

    def test_the_nodes_aggregator_carries_the_bn_traffic(self):
        # In a process of its own, whose stderr says where BN goes.
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run(
                [sys.executable, "-c", _NODE_AGGREGATOR, tmp],
                env=dict(os.environ, LOCAL_WORLD_SIZE="1",
                         PYTHONPATH=os.pathsep.join(sys.path)),
                capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr[-3000:])
        address = r.stdout.split("aggregator ")[1].split()[0]
        self.assertTrue(address.startswith("127.0.0.1:"), r.stdout)
        self.assertIn(f"through {address}", r.stderr)
        self.assertIn("stopped True", r.stdout)
        # Without start_local_server it has nothing to start.
        with self.assertRaisesRegex(ValueError, "start_local_server"):
            bnps.torch.init(servers="127.0.0.1:1", node_aggregator=True)

    def test_the_nodes_aggregator_connects_to_the_jobs_shards_only(self):
        # Started once the servers' addresses are known, it is given their
        # hosts: a worker's hello naming another upstream is refused.
        p = launch.placement(dict(ENV, LOCAL_WORLD_SIZE="1"))
        started = node_server.start(p, job="node-shards", aggregator=True)
        try:
            hub = started.aggregator_process
            self.assertIsNotNone(hub)
            self.assertIn("--shards=127.0.0.1", hub.args)
            self.assertTrue(started.servers.startswith("127.0.0.1:"),
                            started.servers)
            self.assertIsNone(hub.proc.poll())
        finally:
            started.stop()
        self.assertEqual(node_server._shard_hosts(
            "10.0.0.4:7000,10.0.0.5:7000,10.0.0.4:7001,[::1]:7002,"
            "fashion-node-0-0.fashion:7000"),
            ["10.0.0.4", "10.0.0.5", "[::1]", "fashion-node-0-0.fashion"])

    def test_a_server_that_fails_to_start_is_an_error(self):
        with self.assertRaisesRegex(RuntimeError,
                                    "did not start.*worker 0.*no port"):
            bnps.torch.init(start_local_server=True,
                            server_flags=["--no_such_flag_for_this_test"])

    def test_under_kubeflow_trainer_the_nodes_names(self):
        with socket.socket() as s:  # a port free now, for the fixed port
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "1",
               "PET_NODE_RANK": "0",
               "PET_MASTER_ADDR": "fashion-node-0-0.fashion",
               "BNPS_NODE_SERVER_PORT": str(port)}
        p = launch.placement(dict(env, **ENV))
        started = node_server.start(p, job="node-test", host="127.0.0.1",
                                    env=env)
        try:
            self.assertEqual(started.servers,
                             "fashion-node-0-0.fashion:%d" % port)
            self.assertEqual(started.process.address, "127.0.0.1:%d" % port)
        finally:
            started.stop()
        self.assertIsNone(started.process)


if __name__ == "__main__":
    unittest.main()
