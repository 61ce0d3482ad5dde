"""bnps.torch.init and the Connection it returns: this process's connection to
the job's shard servers, which SyncBatchNorm layers use.

    connection = bnps.torch.init()          # from BNPS_* environment variables
    connection = bnps.torch.init(servers="127.0.0.1:7000,127.0.0.1:7001",
                              worker=rank, num_workers=world, job="resnet")
    ...
    connection.finish()                     # the end of this worker's job
    connection.close()                      # or `with bnps.torch.init(...):`

Every argument left as None comes from the environment, like the binaries'
flags: BNPS_SERVERS (comma-separated, shard order), BNPS_WORKER,
BNPS_NUM_WORKERS, BNPS_JOB (default "bnps"), BNPS_TOKEN_FILE, BNPS_TLS_CA,
BNPS_TLS_CERT, BNPS_TLS_KEY, BNPS_RPC_TIMEOUT_S, BNPS_CONNECT_TIMEOUT_S,
BNPS_BN_SPIN_US (how long a BN call polls before it sleeps; default -1: 1000
us where this machine has a core for every worker and server, else 0),
BNPS_STREAM_EXCHANGE (1: queue the layers' exchanges on the device's stream,
bnps/torch/stream_exchange.py; 0: wait for the device at each exchange;
auto, the default: queue on CUDA), BNPS_METRICS_PORT and
BNPS_METRICS_ADDRESS (Prometheus metrics; the port plus LOCAL_RANK),
BNPS_BN_HOST_AGGREGATOR (host:port of this host's BN aggregator,
bnps-host-bn, which the BN traffic then goes through), BNPS_NODE_AGGREGATOR
(1: with start_local_server, each node's rank 0 starts that aggregator).
Without BNPS_WORKER / BNPS_NUM_WORKERS the worker id and count come from the
launcher's variables (torchrun, Kubeflow Trainer, Slurm: bnps.launch), which
must agree with each other.

The first connection opened becomes the default one, which layers without their
own `connection=` use (as torch.distributed's default process group); closing it
clears the default. The BN policy, the gradient mode, the running-statistics
momentum and the barrier timeout are the servers' (connection.policy,
connection.gradients, connection.config).
"""

import atexit
import contextlib
import os
import sys
import threading
import warnings
import weakref

from bnps import launch as _launch
from bnps.client import Client

_default_lock = threading.Lock()
_default = None

POLICIES = ("sync", "async", "local", "recal")


class Connection:
    def __init__(self, client, placement=None, node_server=None,
                 stream_exchange=None):
        self.client = client
        # Layers queue their exchanges on the device stream
        # (bnps/torch/stream_exchange.py): True, False, or None for on
        # CUDA only (queues_on); the queues, by device type.
        self.stream_exchange = stream_exchange
        self._queues = {}
        # Under auto: CUDA's queue could not be made (exchange_queue).
        self._no_cuda_queue = False
        # name -> weakref of the layer training under it (claim_layer_name)
        self._layer_names = {}
        # init(start_local_server=True): the job's servers, one per node.
        self.node_server = node_server
        # Where this process sits (bnps.launch.Placement): local_rank,
        # local_world_size and num_nodes are None where no launcher said.
        self.placement = placement
        self.config = dict(client.config)
        self.policy = self.config["policy"]  # the BN policy
        # "sync" (bulk-synchronous) or "async" (stale-synchronous): the
        # servers' gradient mode, as the C++ client resolved it.
        self.gradients = self.config["gradients"]
        self.worker = client.worker
        self.num_workers = client.num_workers
        self.metrics_port = None  # init(metrics_port=): the port it serves on
        self._step = 0

    # A connection is a live link to the servers: a copy of a model that
    # holds one (copy.deepcopy, as an EMA teacher is made) shares it, and
    # pickling says what to save instead.
    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        raise TypeError(
            "bnps.torch: a connection cannot be pickled; save the model's "
            "state_dict (or layers made without connection=, which use the "
            "default connection)")

    @property
    def closed(self):
        return self.client.closed

    def finish(self):
        """This worker finished the job: its last call to the servers, after
        training and after the running statistics are settled
        (sync_running_stats, recalibrate). Once every worker of the job has
        finished, each server writes its final checkpoint and, unless started
        with --keep_serving, exits; its state can then be exported
        (bnps.export). Not called by close(), which a failed worker also
        calls."""
        self.drain_exchanges()
        self.client.leave()

    def claim_layer_name(self, layer):
        """RuntimeError where another live layer trains under `layer`'s
        name in this process: the servers key a layer's exchanges by its
        name, so the second would get the first's statistics (or have its
        steps refused). A copy of a model (copy.deepcopy, torch.load)
        keeps its layers' names."""
        name = layer.bnps_name
        held = self._layer_names.get(name)
        other = held() if held is not None else None
        if other is layer:
            return
        if other is not None:
            raise RuntimeError(
                f"bnps SyncBatchNorm: two layers named {name!r} train in this "
                f"process; the servers key a layer's exchanges by its name, "
                f"so the second would get the first's statistics. A copy of "
                f"a model (copy.deepcopy, torch.load) keeps the names: give "
                f"its layers names of their own (bnps.torch.name_layers("
                f"copy, prefix='copy.', rename=True)), or run it in eval "
                f"mode. torch.nn.DataParallel's replicas are such copies: "
                f"run a process per GPU (torchrun) instead")
        self._layer_names[name] = weakref.ref(layer)

    def queues_on(self, device):
        """Whether layers on `device` queue their exchanges on its stream:
        stream_exchange where it was set, else on CUDA (where it spares
        the device a wait per layer and pass) unless the CUDA driver could
        not queue them (exchange_queue), and not elsewhere."""
        if self.stream_exchange is None:
            return device.type == "cuda" and not self._no_cuda_queue
        return bool(self.stream_exchange)

    def exchange_queue(self, device):
        """The queue of stream-ordered exchanges for tensors on `device`
        (bnps._native.StreamQueue): on CUDA host functions, elsewhere run
        at once. Where CUDA's cannot be made (bnps.Unavailable: no driver
        that queues host functions), raises when stream_exchange was asked
        for, else warns once and returns None: the layers wait for the
        device instead."""
        on_cuda = device.type == "cuda"
        q = self._queues.get(on_cuda)
        if q is not None:
            return q
        auto = self.stream_exchange is None
        if auto and on_cuda and self._no_cuda_queue:
            return None
        from bnps import _native
        from bnps.errors import Unavailable
        try:
            q = _native.StreamQueue(on_cuda)
        except Unavailable as e:
            if not auto:
                raise
            warnings.warn(f"bnps: layers on CUDA wait for the device at "
                          f"each exchange ({e})")
            self._no_cuda_queue = True
            return None
        self._queues[on_cuda] = q
        if on_cuda:  # queued jobs use this process's host buffers
            atexit.register(_drain_at_exit, weakref.ref(self))
        return q

    def _drain_or_warn(self):
        """drain_exchanges, a failure as a warning."""
        try:
            self.drain_exchanges()
        except Exception as e:
            warnings.warn(f"bnps: a queued BN exchange failed: {e}")

    def drain_exchanges(self, timeout_s=60.0):
        """Waits until the exchanges queued on device streams have run
        (the CUDA devices synchronized) and raises the first failure of one
        (sticky: every later call raises it too). A no-op where no layer
        queued one."""
        for on_cuda, q in list(self._queues.items()):
            if on_cuda:
                import torch
                torch.cuda.synchronize()
            q.drain(timeout_s)

    def host_waits(self):
        """How often the host waited for the device around this
        connection's queued exchanges: {"layers": the layers' own waits
        (reading device values outside the queue: a layer's running
        statistics once, when it first takes a route, or after they changed
        otherwise), "drains": drain_exchanges calls (Connection.step's)
        that found exchanges not yet run}. The queued routes make no other:
        per step after the first, "layers" stays put."""
        from bnps.torch import _device_route
        layers = drains = 0
        for q in list(self._queues.values()):
            w = _device_route.host_waits(q)
            layers, drains = layers + w[0], drains + w[1]
        return {"layers": layers, "drains": drains}

    def close(self):
        """Disconnects (idempotent); layers using it fail afterwards. With
        init(start_local_server=True) a collective: a barrier of every
        process, then the node's server stops."""
        global _default
        with _default_lock:
            if _default is self:
                _default = None
        self._drain_or_warn()  # close() also runs after a failure
        self.client.close()
        if self.node_server is not None:
            self.node_server.stop()
            self.node_server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextlib.contextmanager
    def step(self):
        """Brackets one training iteration. Under async gradients it waits
        until the staleness bound lets this worker begin (StartStep) and
        reports the step done afterwards (FinishStep); under sync gradients it
        only counts. Use it around each iteration of an async job:

            for x, y in loader:
                with connection.step():
                    loss = model(x) ...; loss.backward(); opt.step()
        """
        self.client.begin_step(self._step)
        yield self._step
        self.drain_exchanges()
        self._step += 1
        self.client.end_step(self._step)

    def __repr__(self):
        return (f"bnps.torch.Connection(worker={self.worker}/{self.num_workers}, "
                f"policy={self.policy}, job={self.config.get('job')!r})")


def _drain_at_exit(ref):
    """At interpreter exit: the queued exchanges run before the host
    buffers they use go away (a script that never closed its connection)."""
    connection = ref()
    if connection is not None and not connection.closed:
        connection._drain_or_warn()


def _env(name, value, convert=str, default=None):
    if value is not None:
        return value
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return convert(raw)
    except ValueError:
        raise ValueError(f"bnps: ${name}={raw!r} is not valid") from None


def _flag(raw):
    value = {"1": True, "true": True, "0": False, "false": False}.get(
        raw.strip().lower())
    if value is None:
        raise ValueError(raw)
    return value


def _flag_or_auto(raw):
    """_flag, and None for "auto"."""
    return None if raw.strip().lower() == "auto" else _flag(raw)


def init(servers=None, worker=None, num_workers=None, job=None,
         token_file=None, tls_ca=None, tls_cert=None, tls_key=None,
         connect_timeout_s=None, rpc_timeout_s=None, set_default=True,
         start_local_server=False, policy="sync", server_flags=(),
         server_host=None, stream_exchange=None, metrics_port=None,
         metrics_address=None, node_aggregator=None):
    """Connects this process to the job as worker `worker` of `num_workers`
    and returns a Connection. Raises ValueError for missing or bad arguments,
    bnps.Unavailable when a server cannot be reached, bnps.FailedPrecondition
    when the servers run another job or the worker id is taken.

    start_local_server=True (instead of servers=): every node's local rank 0
    starts a bnps_server (--policy=`policy`, `server_flags`, bound to
    `server_host`) and all processes connect to all of them
    (bnps.torch.node_server; a collective over torch.distributed, which must
    be initialized). close() is then a collective too. With
    node_aggregator=True (or BNPS_NODE_AGGREGATOR=1) the local rank 0 also
    starts the node's BN aggregator (bnps_host_bn) for the node's
    LOCAL_WORLD_SIZE processes, and every process's BN traffic goes
    through its node's: one frame per round for the node, to each shard.

    stream_exchange (or BNPS_STREAM_EXCHANGE=1, 0 or auto): whether layers
    queue their exchanges on the device's stream instead of waiting for
    the device (bnps/torch/stream_exchange.py); a failed exchange is then
    raised by a later call. None (auto), the default: on CUDA, not on the
    CPU.

    metrics_port=P (or BNPS_METRICS_PORT=P, to which each process adds its
    LOCAL_RANK, so that one variable serves a node): this process serves
    its Prometheus metrics (the BN round trips per layer and pass, the
    retries; as bnps_worker's) at http://<metrics_address>:P/metrics
    (metrics_address or BNPS_METRICS_ADDRESS, default 127.0.0.1; P = 0
    picks a free port). Connection.metrics_port is the port (None
    without)."""
    global _default
    servers = _env("BNPS_SERVERS", servers)
    if bool(servers) == bool(start_local_server):
        raise ValueError(
            "bnps.torch.init: " + ("start_local_server=True and servers (or "
                                   "BNPS_SERVERS) both given" if servers else
                                   "no servers (pass servers= or set "
                                   "BNPS_SERVERS=host:port,host:port, or "
                                   "start_local_server=True)"))
    aggregate = _env("BNPS_NODE_AGGREGATOR", node_aggregator, _flag, False)
    if aggregate and not start_local_server:
        raise ValueError("bnps.torch.init: node_aggregator (or "
                         "BNPS_NODE_AGGREGATOR) needs start_local_server=True;"
                         " with servers of your own, run bnps-host-bn and "
                         "set BNPS_BN_HOST_AGGREGATOR")
    stream = _env("BNPS_STREAM_EXCHANGE", stream_exchange, _flag_or_auto)
    if stream not in (None, True, False, "auto"):
        raise ValueError("bnps.torch.init: stream_exchange is True, False, "
                         f"or None or 'auto' (on CUDA), not {stream!r}")
    stream = None if stream == "auto" else stream
    placement = _launch.placement(worker=worker, num_workers=num_workers)
    port = _metrics_port(placement, metrics_port)
    job = _env("BNPS_JOB", job, default="bnps")
    node_server = None
    if start_local_server:
        from bnps.torch import node_server as _node_server
        node_server = _node_server.start(
            placement, policy=policy, job=job, flags=server_flags,
            host=_env("BNPS_SERVER_HOST", server_host), aggregator=aggregate)
        servers = node_server.servers

    def stop_node():
        if node_server is not None:
            node_server.stop_processes()

    try:
        client = _connect(servers, job, placement, token_file, tls_ca,
                          tls_cert, tls_key, connect_timeout_s, rpc_timeout_s,
                          node_server and node_server.aggregator)
    except BaseException:
        stop_node()
        raise
    try:
        if port is not None:
            port = _serve_metrics(client, port, metrics_address)
    except BaseException:
        client.close()
        stop_node()
        raise
    connection = Connection(client, placement, node_server, stream)
    connection.metrics_port = port
    if set_default:
        with _default_lock:
            if _default is None:
                _default = connection
    return connection


def _metrics_port(placement, port):
    """The port init's metrics_port asks for: the argument, else
    $BNPS_METRICS_PORT plus the local rank (0 stays 0: a free port); None
    for no metrics."""
    if port is not None:
        return int(port)
    raw = os.environ.get("BNPS_METRICS_PORT", "")
    if raw == "":
        return None
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"bnps: $BNPS_METRICS_PORT={raw!r} is not a "
                         f"port") from None
    return port + (placement.local_rank or 0) if port != 0 else 0


def _serve_metrics(client, port, address):
    """Serves `client`'s metrics on `port`; returns the port bound."""
    host = _env("BNPS_METRICS_ADDRESS", address, default="127.0.0.1")
    bound = client.serve_metrics(host, int(port))
    print(f"bnps worker {client.worker}: metrics at "
          f"http://{host}:{bound}/metrics", file=sys.stderr, flush=True)
    return bound


def _connect(servers, job, placement, token_file, tls_ca, tls_cert, tls_key,
             connect_timeout_s, rpc_timeout_s, aggregator=None):
    return Client(
        servers, job=job,
        worker=placement.worker, num_workers=placement.num_workers,
        token_file=_env("BNPS_TOKEN_FILE", token_file, default=""),
        tls_ca=_env("BNPS_TLS_CA", tls_ca, default=""),
        tls_cert=_env("BNPS_TLS_CERT", tls_cert, default=""),
        tls_key=_env("BNPS_TLS_KEY", tls_key, default=""),
        connect_timeout_s=_env("BNPS_CONNECT_TIMEOUT_S", connect_timeout_s,
                               float, 30.0),
        rpc_timeout_s=_env("BNPS_RPC_TIMEOUT_S", rpc_timeout_s, float, 30.0),
        bn_spin_us=_env("BNPS_BN_SPIN_US", None, int, -1),
        bn_host_aggregator=aggregator or _env("BNPS_BN_HOST_AGGREGATOR", None,
                                              default=""))


def default_connection():
    """The default connection; RuntimeError if none is open."""
    s = _default
    if s is None:
        raise RuntimeError("bnps.torch: no connection; call bnps.torch.init() "
                           "first (or pass connection= to the layer)")
    return s
