"""bnps.Client: one worker's connection to a job's shard servers.

A thin wrapper of the client library (client/ps_client.h, through its C
ABI, bnps._native): the BN exchanges, recalibration, running statistics
and the async policy's step clocks. Per-channel vectors are float64 NumPy
arrays (or anything NumPy turns into one). Every failed call raises a
bnps.errors.BnpsError subclass. Thread-safe; the GIL is released while a call
waits on the servers.

Layers are keyed by name (1 to 256 bytes) and calls by step: every worker of a
sync job must make the same calls, and each (layer, step, phase) call is
applied at most once per worker.
"""

import functools

from bnps import _native
from bnps import errors


def _translated(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _native.Error as e:
            raise errors.from_native(e) from None
    return wrapper


class Client:
    """Connects to every shard (registering as `worker` of `num_workers`) or
    raises: Unavailable when a server cannot be reached within
    connect_timeout_s, FailedPrecondition when the servers' job differs.
    bn_spin_us: how long a BN call polls for its answer before it sleeps
    (-1: 1000 where this machine has a core for every worker and server of
    the job, else 0; as bnps_worker --bn_spin_us). bn_host_aggregator:
    "host:port" of this host's BN aggregator (bnps-host-bn), which the BN
    traffic then goes through (as bnps_worker --bn_host_aggregator); ""
    for none."""

    @_translated
    def __init__(self, servers, job="bnps", worker=0, num_workers=1,
                 token_file="", tls_ca="", tls_cert="", tls_key="",
                 connect_timeout_s=30.0, rpc_timeout_s=30.0, bn_spin_us=-1,
                 bn_host_aggregator=""):
        if isinstance(servers, str):
            servers = [s for s in servers.split(",") if s]
        self._native = _native.Client(
            list(servers), job, int(worker), int(num_workers), token_file or "",
            tls_ca or "", tls_cert or "", tls_key or "",
            float(connect_timeout_s), float(rpc_timeout_s), int(bn_spin_us),
            bn_host_aggregator or "")
        self.config = self._native.config()
        # bnps.torch's layers pass it to bnps._native.layer_forward and
        # layer_backward: one crossing per pass.
        self.native = self._native
        self.worker = int(worker)
        self.num_workers = int(num_workers)

    def close(self):
        """Stops heartbeating and closes the connections; idempotent. Calls
        in flight in other threads keep the connection until they return
        (they finish or time out as if close() had not come); later calls
        raise FailedPrecondition."""
        self._native.close()

    @property
    def closed(self):
        return self._native.closed

    @_translated
    def serve_metrics(self, host="127.0.0.1", port=0):
        """Serves this client's Prometheus metrics at
        http://host:port/metrics (port 0: a free one) until the client is
        freed, and returns the port: bnps_worker's series
        (docs/observability.md), the BN round trips per layer and pass
        and the retries, counted from the connection on. Plain HTTP: keep
        `host` on a trusted network. Raises InvalidArgument for a bad
        port, Unavailable when it cannot listen, FailedPrecondition when it
        serves already."""
        return self._native.serve_metrics(host, port)

    @_translated
    def metrics_text(self):
        """The same metrics in the Prometheus text format."""
        return self._native.metrics_text()

    @_translated
    def bn_forward(self, layer, step, count, mean, m2, want_running=False):
        """Returns (count, mean, m2, running_mean, running_var, contributors);
        sync: the global batch's moments; async: the admissible others'."""
        return self._native.bn_forward(layer, step, count, mean, m2,
                                       want_running)

    @_translated
    def bn_backward(self, layer, step, sum_dy, sum_dy_xhat):
        """sync: returns the global (sum_dy, sum_dy_xhat)."""
        return self._native.bn_backward(layer, step, sum_dy, sum_dy_xhat)

    @_translated
    def bn_recal(self, layer, batch, count, mean, m2):
        return self._native.bn_recal(layer, batch, count, mean, m2)

    @_translated
    def bn_recal_finish(self, layer):
        """Returns the population (mean, var) over every worker's batches."""
        return self._native.bn_recal_finish(layer)

    @_translated
    def bn_local_running(self, layer, mean, var):
        """local: returns the workers' average running (mean, var)."""
        return self._native.bn_local_running(layer, mean, var)

    @_translated
    def bn_running(self, layer, channels):
        """The servers' running (mean, var) of the layer."""
        return self._native.bn_running(layer, channels)

    @_translated
    def init_parameters(self, params):
        """{name: float32 array}; the first initialization of a key wins."""
        return self._native.init_parameters(params)

    @_translated
    def push_gradients(self, step, num_samples, grads):
        """{name: float32 array}: the gradients of `step` summed over
        `num_samples` samples."""
        return self._native.push_gradients(step, num_samples, grads)

    @_translated
    def pull_parameters(self, min_version, keys=()):
        """{name: float32 array} of `keys` (all if empty) once each has had
        `min_version` updates applied (0: at once)."""
        return self._native.pull_parameters(min_version, list(keys))

    @_translated
    def start_step(self, step):
        return self._native.start_step(step)

    @_translated
    def finish_step(self, completed):
        return self._native.finish_step(completed)

    @_translated
    def begin_step(self, step):
        """Before each iteration: start_step under async gradients, `step`
        at once under sync gradients (the job's rule, applied in C++)."""
        return self._native.begin_step(step)

    @_translated
    def end_step(self, completed):
        """After each iteration: finish_step under async gradients,
        nothing under sync gradients."""
        return self._native.end_step(completed)

    @_translated
    def live_workers(self):
        return self._native.live_workers()

    @_translated
    def leave(self):
        """This worker finished the job (its last call). Once every worker
        has left, the servers write their final checkpoints and, unless
        started with --keep_serving, exit."""
        return self._native.leave()


@_translated
def merge_moments(count_a, mean_a, m2_a, count_b, mean_b, m2_b):
    """Chan's merge of two moments, a first, in float64 (bn/moments.h)."""
    return _native.merge_moments(count_a, mean_a, m2_a, count_b, mean_b,
                                 m2_b)
