"""One bnps server per node, started by the node's local rank 0:
bnps.torch.init(start_local_server=True) under torchrun (or any launcher
that gives LOCAL_RANK), for jobs that want no separate server processes.

Every process of the job takes part (a collective, like
torch.distributed.init_process_group, which must have run first: the
servers' addresses travel over its default group, or over a gloo group made
for the purpose when the default one is not gloo):

1. each process says whether it is its node's local rank 0; those are the
   shards, numbered in the order of their global ranks;
2. each local rank 0 starts `bnps_server --shard=k --num_shards=S
   --num_workers=W` on `host` (default: 127.0.0.1 for a one-node job, else
   this host's address) with --port=0 and --bn_port=0, and says the address
   it got, or why it failed;
3. every process gets the list, in shard order, or RuntimeError naming the
   node whose server failed (on every process, so none waits forever).

Under Kubeflow Trainer (bnps.launch.trainer_servers) the shards and the
addresses are the trainer nodes' stable DNS names instead: node N's local
rank 0 starts shard N on `host` (default 0.0.0.0) at the fixed port, and
step 3 only reports failures.

With aggregator=True (init's node_aggregator) each local rank 0 also
starts the node's BN aggregator (bnps_host_bn on 127.0.0.1, for
LOCAL_WORLD_SIZE processes) once the servers' addresses are known (after
step 3), with --shards naming their hosts, so that it connects to the job's
shards alone, whatever address a worker's hello names; every process's BN
traffic goes through its node's (the process ranked worker - local_rank:
torchrun's contiguous ranks), whose address a second gather tells.

BNPS_NODE_SERVER_METRICS_PORT=P gives each node's server a Prometheus
endpoint on port P at its own address (the workers' BNPS_METRICS_PORT is
theirs alone: servers started from Python never inherit it).

The server lives as long as the process that started it (it dies with it,
and NodeServer.stop() ends it); Connection.close() of such a job is a
collective (a barrier first), so that no node's server stops while another
worker still needs it.
"""

import os
import socket

import torch.distributed as dist

from bnps import cluster as _cluster
from bnps import launch as _launch


class NodeServer:
    """The servers of a job with a server per node. `servers` is the
    comma-separated list, in shard order; `process` this process's server
    (a bnps.cluster.ServerProcess) or None; `group` the process group the
    addresses travelled on."""

    def __init__(self, servers, process, group, aggregator=None,
                 aggregator_process=None):
        self.servers = servers
        self.process = process
        self.group = group
        # With start(aggregator=True): "host:port" of this node's BN
        # aggregator, and the process of it this process started, if any.
        self.aggregator = aggregator
        self.aggregator_process = aggregator_process

    def stop(self):
        """A barrier of every process of the job (while the process group
        lives), then this process's server, if any, stops. Idempotent."""
        if self.group is not None and dist.is_initialized():
            dist.barrier(group=self.group)
        self.group = None
        self.stop_processes()

    def stop_processes(self):
        """This process's aggregator and server, if any, stop, without the
        barrier (an init that failed after starting them). Idempotent."""
        for name in ("aggregator_process", "process"):
            p = getattr(self, name)
            if p is not None:
                p.stop()
                setattr(self, name, None)


def _group():
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "bnps.torch.init(start_local_server=True) needs "
            "torch.distributed.init_process_group() first (the servers' "
            "addresses travel over it), or give the servers in BNPS_SERVERS")
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    return dist.new_group(backend="gloo")


def _metrics_flags(flags, bind, env):
    """`flags`, and where BNPS_NODE_SERVER_METRICS_PORT is set (and `flags`
    name no port of their own) the server's metrics endpoint on that port
    at the server's own address."""
    e = os.environ if env is None else env
    raw = e.get("BNPS_NODE_SERVER_METRICS_PORT", "")
    if raw == "" or any(f.startswith("--metrics_port") for f in flags):
        return list(flags)
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"bnps: $BNPS_NODE_SERVER_METRICS_PORT={raw!r} is "
                         f"not a port") from None
    return list(flags) + [f"--metrics_port={port}",
                          f"--metrics_address={bind}"]


def _shard_hosts(servers):
    """The hosts of the servers' "host:port" addresses (comma-separated),
    for bnps_host_bn --shards: any BN port there (the servers pick theirs)."""
    hosts = []
    for address in servers.split(","):
        host = address.rpartition(":")[0] if ":" in address else address
        if host and host not in hosts:
            hosts.append(host)
    return hosts


def _start_aggregator(placement, flags, start_timeout_s, servers):
    """This node's bnps_host_bn for its LOCAL_WORLD_SIZE processes, on
    127.0.0.1 (its workers are local), with the servers' token file, that
    connects to the hosts of `servers` only; returns it once it listens."""
    args = ["--host=127.0.0.1", "--port=0",
            f"--workers={placement.local_world_size}",
            "--shards=" + ",".join(_shard_hosts(servers))]
    args += [f for f in flags if f.startswith("--token_file=")]
    hub = _cluster.ServerProcess(
        args, _cluster.find_host_bn_binary(), start_timeout_s).launch()
    try:
        hub.wait_address("bnps_host_bn")
    except BaseException:
        hub.stop()
        raise
    return hub


def _my_aggregator(placement, got):
    """The aggregator address of this process's node from the gathered
    (server, aggregator, host, error) entries: that of the process ranked
    worker - local_rank (torchrun's ranks are contiguous per node), which
    must be a node's first process on this host."""
    lead = placement.worker - placement.local_rank
    _, aggregator, host, _ = got[lead] if 0 <= lead < len(got) else \
        (None, None, None, None)
    if aggregator is None or host != socket.gethostname():
        raise ValueError(
            f"bnps: worker {placement.worker}'s node has no BN aggregator at "
            f"rank {lead} (a node's aggregator needs each node's processes "
            f"ranked one after another, as torchrun ranks them)")
    return aggregator


def _gather_started(placement, group, leader, what, start):
    """Each local rank 0 calls `start`, which returns (the process it
    started, the server's address, the aggregator's address); every process
    gets the (server, aggregator, host, error) entries of all, in rank
    order, and this process's started process (or None). RuntimeError
    naming the nodes where `what` did not start, on every process (this
    process's stopped first), so that none waits forever."""
    started = None
    mine = (None, None, socket.gethostname(), None)
    if leader:
        try:
            started, server, hub = start()
            mine = (server, hub, mine[2], None)
        except (OSError, RuntimeError, ValueError) as e:
            mine = (None, None, mine[2], f"{type(e).__name__}: {e}")
    got = [None] * placement.num_workers
    dist.all_gather_object(got, mine, group=group)
    failed = [f"worker {w}: {err}" for w, (_, _, _, err) in enumerate(got)
              if err]
    if failed:
        if started is not None:
            started.stop()
        raise RuntimeError(f"bnps: a node's {what} did not start: " +
                           "; ".join(failed))
    return got, started


def start(placement, policy="sync", job="bnps", host=None, flags=(),
          server_bin=None, start_timeout_s=60.0, env=None, aggregator=False):
    """Starts this node's server if this process is its local rank 0, and
    returns the job's NodeServer; see the module. `placement` is a
    bnps.launch.Placement whose local_rank is known; `env` (default
    os.environ) the launcher's variables. With `aggregator`, the local rank
    0 also starts the node's BN aggregator (bnps_host_bn) for the node's
    processes, which NodeServer.aggregator names to each. Raises ValueError
    without a local rank or when the process group's size or rank differ
    from the placement's, RuntimeError when a server fails to start."""
    leader = _launch.starts_node_server(placement)
    if aggregator and not placement.local_world_size:
        raise ValueError("bnps: a node's BN aggregator needs the node's "
                         "process count (LOCAL_WORLD_SIZE)")
    group = _group()
    if dist.get_world_size(group) != placement.num_workers or \
            dist.get_rank(group) != placement.worker:
        raise ValueError(
            f"bnps: the process group has rank {dist.get_rank(group)} of "
            f"{dist.get_world_size(group)}, but bnps worker "
            f"{placement.worker} of {placement.num_workers}")
    known = _launch.trainer_servers(env)
    if known is not None:
        shard, num_shards, port = known.shard, known.num_shards, known.port
        bind = host or "0.0.0.0"
    else:
        leaders = [None] * placement.num_workers
        dist.all_gather_object(leaders, leader, group=group)
        num_shards = sum(1 for lead in leaders if lead)
        shard = sum(1 for lead in leaders[:placement.worker] if lead)
        port = 0
        bind = host or ("127.0.0.1" if num_shards == 1 else
                        socket.gethostbyname(socket.gethostname()))

    def start_server():
        process = _cluster.ServerProcess(
            _cluster.server_args(shard, num_shards, placement.num_workers,
                                 policy, job, host=bind, port=port,
                                 flags=_metrics_flags(flags, bind, env)),
            server_bin, start_timeout_s).start()
        return process, process.address, None

    got, process = _gather_started(placement, group, leader, "server",
                                   start_server)
    servers = known.servers if known is not None else \
        ",".join(addr for addr, _, _, _ in got if addr)
    hub = mine_hub = None
    if aggregator:
        def start_hub():
            started = _start_aggregator(placement, flags, start_timeout_s,
                                        servers)
            return started, None, started.address

        try:
            hubs, hub = _gather_started(placement, group, leader,
                                        "BN aggregator", start_hub)
            mine_hub = _my_aggregator(placement, hubs)
        except BaseException:
            for p in (hub, process):
                if p is not None:
                    p.stop()
            raise
    return NodeServer(servers, process, group, mine_hub, hub)
