"""A test's own one-worker job: a bnps_server shard on 127.0.0.1 under a
policy, and a connection to it as worker 0 (bnps.torch.init); both stop
when the test ends (its cleanups). A fresh job per test, so every test's
layers start at step 0 (a server starts in about 0.2 s)."""

import re

import bnps.torch
from bnps.cluster import LocalCluster


def connect(test, policy, keep_serving=True, **init_args):
    """(connection, cluster) of a new job of one worker under `policy`."""
    cluster = LocalCluster(num_servers=1, num_workers=1, policy=policy,
                           keep_serving=keep_serving).start()
    test.addCleanup(cluster.stop)
    connection = bnps.torch.init(servers=cluster.servers, worker=0,
                                 num_workers=1, set_default=False,
                                 **init_args)
    test.addCleanup(connection.close)
    return connection, cluster


_ROUND_TRIPS = re.compile(
    r'^bnps_worker_bn_round_trip_seconds_count\{layer="([^"]*)",'
    r'phase="([^"]*)"\} (\d+)', re.M)


def round_trips(connection):
    """{(layer, phase): BN calls answered} from the client's own metrics
    (bnps_worker_bn_round_trip_seconds): what went to the servers."""
    return {(layer, phase): int(n) for layer, phase, n in
            _ROUND_TRIPS.findall(connection.client.metrics_text())}
