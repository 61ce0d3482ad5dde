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

    def __init__(self, servers, process, group):
        self.servers = servers
        self.process = process
        self.group = group

    def stop(self):
        """A barrier of every process of the job (while the process group
        lives), then this process's server, if any, stops. Idempotent."""
        if self.group is not None and dist.is_initialized():
            dist.barrier(group=self.group)
        self.group = None
        if self.process is not None:
            self.process.stop()
            self.process = None


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


def start(placement, policy="sync", job="bnps", host=None, flags=(),
          server_bin=None, start_timeout_s=60.0, env=None):
    """Starts this node's server if this process is its local rank 0, and
    returns the job's NodeServer; see the module. `placement` is a
    bnps.launch.Placement whose local_rank is known; `env` (default
    os.environ) the launcher's variables. Raises ValueError
    without a local rank or when the process group's size or rank differ
    from the placement's, RuntimeError when a server fails to start."""
    leader = _launch.starts_node_server(placement)
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
    process, mine = None, (None, None)
    if leader:
        try:
            process = _cluster.ServerProcess(
                _cluster.server_args(shard, num_shards, placement.num_workers,
                                     policy, job, host=bind, port=port,
                                     flags=_metrics_flags(flags, bind, env)),
                server_bin, start_timeout_s).start()
            mine = (process.address, None)
        except (OSError, RuntimeError) as e:
            mine = (None, f"{type(e).__name__}: {e}")
    got = [None] * placement.num_workers
    dist.all_gather_object(got, mine, group=group)
    failed = [f"worker {w}: {err}" for w, (_, err) in enumerate(got) if err]
    if failed:
        if process is not None:
            process.stop()
        raise RuntimeError("bnps: a node's server did not start: " +
                           "; ".join(failed))
    servers = known.servers if known is not None else \
        ",".join(addr for addr, _ in got if addr)
    return NodeServer(servers, process, group)
