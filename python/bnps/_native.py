"""The native part of bnps: libbnps.so (python/native/bnps_c.h), a plain C
ABI loaded with ctypes, so one build serves every CPython >= 3.9 and no
torch or Python headers are linked. Internal: the package's modules use it;
users import bnps.

Where the library is looked for: bnps._library says (the wheel, then
sys.path, which has bazel-bin/python under tools/bnps_python and in Bazel
tests' runfiles).

Every failed call raises the bnps.errors class of its status code
(InvalidArgument, DeadlineExceeded, ...), made from an Error(code,
code_name, message). Vectors cross as float64 NumPy arrays,
parameters as float32 arrays, copied into buffers this module owns.
"""

import ctypes
import json
import threading

import numpy as np

from bnps import _library, errors
from bnps._library import Error

_API_VERSION = 10  # python/native/bnps_c.h's BNPS_C_API_VERSION it needs
_ERR_LEN = _library.ERR_LEN

c_int, c_int64, c_double = ctypes.c_int, ctypes.c_int64, ctypes.c_double
c_char_p, c_void_p, c_size_t = ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t
# Float arrays cross as plain addresses (an ndarray's .ctypes.data): 0.8 us
# each against 4.7 us for .ctypes.data_as(POINTER(c_double)), on a path
# that runs per layer and step.
_D = c_void_p
_I64 = ctypes.POINTER(c_int64)
_INT = ctypes.POINTER(c_int)


def _load():
    lib = _library.open_library(_API_VERSION)
    err = [c_char_p, c_size_t]
    sig = {
        "bnps_status_name": (c_char_p, [c_int]),
        "bnps_arrays_size": (c_int64, [c_void_p]),
        "bnps_arrays_name": (c_char_p, [c_void_p, c_int64]),
        "bnps_arrays_itemsize": (c_int, [c_void_p, c_int64]),
        "bnps_arrays_ndim": (c_int, [c_void_p, c_int64]),
        "bnps_arrays_shape": (None, [c_void_p, c_int64, _I64]),
        "bnps_arrays_copy": (None, [c_void_p, c_int64, c_void_p]),
        "bnps_arrays_free": (None, [c_void_p]),
        "bnps_client_connect": (c_int, [c_char_p, c_char_p, c_int, c_int,
                                        c_char_p, c_char_p, c_char_p, c_char_p,
                                        c_double, c_double,
                                        ctypes.POINTER(c_void_p)] + err),
        "bnps_client_connect2": (c_int, [c_char_p, c_char_p, c_int, c_int,
                                         c_char_p, c_char_p, c_char_p,
                                         c_char_p, c_double, c_double, c_int,
                                         ctypes.POINTER(c_void_p)] + err),
        "bnps_client_connect3": (c_int, [c_char_p, c_char_p, c_int, c_int,
                                         c_char_p, c_char_p, c_char_p,
                                         c_char_p, c_double, c_double, c_int,
                                         c_char_p,
                                         ctypes.POINTER(c_void_p)] + err),
        "bnps_client_close": (None, [c_void_p]),
        "bnps_client_closed": (c_int, [c_void_p]),
        "bnps_client_free": (None, [c_void_p]),
        "bnps_client_config_json": (c_int, [c_void_p, c_char_p, c_size_t] +
                                    err),
        "bnps_client_serve_metrics": (c_int, [c_void_p, c_char_p, c_int,
                                              _INT] + err),
        "bnps_client_metrics_text": (c_int, [c_void_p, c_char_p, c_size_t,
                                             ctypes.POINTER(c_size_t)] + err),
        "bnps_client_live_workers": (c_int, [c_void_p, _INT, c_int, _INT] +
                                     err),
        "bnps_client_bn_forward": (c_int, [c_void_p, c_char_p, c_int64,
                                           c_int64, _D, _D, c_int64, c_int,
                                           _I64, _D, _D, _INT, _D, _D, _INT] +
                                   err),
        "bnps_client_bn_backward": (c_int, [c_void_p, c_char_p, c_int64, _D,
                                            _D, c_int64, _D, _D] + err),
        "bnps_client_bn_recal": (c_int, [c_void_p, c_char_p, c_int64, c_int64,
                                         _D, _D, c_int64] + err),
        "bnps_client_bn_recal_finish": (c_int, [c_void_p, c_char_p,
                                                ctypes.POINTER(c_void_p)] +
                                        err),
        "bnps_client_bn_local_running": (c_int, [c_void_p, c_char_p, _D, _D,
                                                 c_int64, _D, _D] + err),
        "bnps_client_bn_running": (c_int, [c_void_p, c_char_p, c_int64, _D,
                                           _D] + err),
        "bnps_client_start_step": (c_int, [c_void_p, c_int64, _I64] + err),
        "bnps_client_finish_step": (c_int, [c_void_p, c_int64] + err),
        "bnps_client_begin_step": (c_int, [c_void_p, c_int64, _I64] + err),
        "bnps_client_end_step": (c_int, [c_void_p, c_int64] + err),
        "bnps_client_leave": (c_int, [c_void_p] + err),
        "bnps_export": (c_int, [c_char_p] * 7 + [c_double, c_char_p,
                                                  c_size_t] + err),
        "bnps_client_init_parameters": (c_int, [c_void_p, c_int, c_void_p,
                                                c_void_p, c_void_p, c_void_p] +
                                        err),
        "bnps_client_push_gradients": (c_int, [c_void_p, c_int64, c_int64,
                                               c_int, c_void_p, c_void_p,
                                               c_void_p, c_void_p] + err),
        "bnps_client_pull": (c_int, [c_void_p, c_int64, c_int, c_void_p,
                                     ctypes.POINTER(c_void_p)] + err),
        "bnps_worker_bn_new": (c_int, [c_char_p, c_double,
                                       ctypes.POINTER(c_void_p)] + err),
        "bnps_worker_bn_free": (None, [c_void_p]),
        "bnps_worker_bn_check_layer": (c_int, [c_void_p, c_char_p, c_int,
                                               c_int, c_double] + err),
        "bnps_worker_bn_plan_forward": (None, [c_void_p, c_int, _INT, _INT]),
        "bnps_worker_bn_resolve": (c_int, [c_void_p, c_int64, _D, _D, c_int64,
                                           c_int, c_int64, _D, _D, c_int,
                                           _I64, _D, _D, _INT, _INT] + err),
        "bnps_worker_bn_settle": (c_int, [c_void_p, _INT] + err),
        "bnps_update_running": (c_int, [c_int64, _D, _D, c_int64, c_int,
                                        c_double, _I64, _D, _D] + err),
        "bnps_merge_moments": (c_int, [c_int64, _D, _D, c_int64, _D, _D,
                                       c_int64, _I64, _D, _D] + err),
        "bnps_layer_forward": (c_int, [c_void_p, c_void_p, c_char_p, c_int64,
                                       _D, c_int64, c_int64, c_int64, _D, _D,
                                       c_double, c_int, c_double, _D, _D, _D,
                                       c_int, _D, _D, _D] + err),
        "bnps_layer_exchange_forward": (
            c_int, [c_void_p, c_void_p, c_char_p, c_int64, c_int64, _D, _D,
                    c_int64, c_int, c_double, _D, _D, _D, _D, _D] + err),
        "bnps_layer_exchange_backward": (
            c_int, [c_void_p, c_char_p, c_int64, _D, _D, c_int64, c_int64, _D,
                    _D, c_double, _D] + err),
        "bnps_stream_queue_new": (c_int, [c_int, ctypes.POINTER(c_void_p)] +
                                  err),
        "bnps_stream_queue_free": (None, [c_void_p]),
        "bnps_stream_queue_drain": (c_int, [c_void_p, c_double] + err),
        "bnps_stream_queue_counts": (None, [c_void_p, _I64]),
        "bnps_stream_queue_forward": (
            c_int, [c_void_p, c_void_p, c_void_p, c_void_p, c_char_p,
                    c_int64, c_int64, c_void_p, c_int, c_int64, c_double,
                    c_int, c_double, _D, _D, _D, c_void_p, c_int, c_void_p,
                    c_int, _D, _D, ctypes.POINTER(c_void_p)] + err),
        "bnps_stream_queue_backward": (
            c_int, [c_void_p, c_void_p, c_void_p, c_char_p, c_int64,
                    c_void_p, c_int, c_int, c_int64, c_void_p, c_double,
                    c_void_p, c_int] + err),
        "bnps_outcome_free": (None, [c_void_p]),
        # The fused route's device passes (bnps/torch/_device_route.py).
        "bnps_device_pass_new": (c_int, [
            c_void_p, c_void_p, c_void_p, c_char_p, c_int64, c_double, c_int,
            c_double, c_int, c_void_p, c_void_p, c_void_p, c_void_p,
            c_void_p, c_int, c_void_p, c_int64, c_int64,
            ctypes.POINTER(c_void_p)] + err),
        "bnps_device_pass_free": (None, [c_void_p]),
        "bnps_device_pass_steps": (None, [c_void_p, c_void_p]),
        # (The error buffer as an address: an int crosses fastest.)
        "bnps_device_call_forward": (c_int, [c_void_p, c_void_p, c_size_t]),
        "bnps_device_call_backward": (c_int, [c_void_p, c_void_p, c_size_t]),
        "bnps_stream_queue_waits": (None, [c_void_p, c_void_p]),
        "bnps_stream_queue_exchange_seconds": (c_double, [c_void_p]),
        "bnps_stream_queue_new_recording": (
            c_int, [ctypes.POINTER(c_void_p)] + err),
        "bnps_stream_queue_record": (c_int, [c_void_p, c_int, c_int] + err),
        "bnps_stream_queue_note_wait": (None, [c_void_p]),
        "bnps_layer_pass_forward": (c_int, [c_void_p] + err),
        "bnps_layer_pass_backward": (c_int, [c_void_p] + err),
        "bnps_layer_backward": (c_int, [c_void_p, c_char_p, c_int64, _D, _D,
                                        c_int64, c_int64, c_int64, _D,
                                        c_int64, _D, c_double, c_int, _D, _D,
                                        _D] + err),
    }
    for name, (restype, argtypes) in sig.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_lib = _load()


_tls = threading.local()


def _call(fn, *args):
    """fn(*args, err, len); raises unless it returns 0."""
    err = getattr(_tls, "err", None)
    if err is None:  # one message buffer per thread, reused
        err = _tls.err = ctypes.create_string_buffer(_ERR_LEN)
    code = fn(*args, err, _ERR_LEN)
    if code != 0:
        raise error(code, err)


def error(code, err):
    """The bnps.errors exception of a call that returned `code` (not 0)
    with its message in `err` (a ctypes.create_string_buffer)."""
    return errors.from_native(Error(
        code, _lib.bnps_status_name(code).decode(),
        err.value.decode("utf-8", "replace")))


def _invalid(message):
    return errors.from_native(Error(3, "INVALID_ARGUMENT", message))


def _f64(a, what="array"):
    v = np.ascontiguousarray(a, dtype=np.float64)
    if v.ndim != 1:
        raise _invalid(f"{what} must be 1-D, not {v.ndim}-D")
    return v


def _ptr(v):
    """The address of a contiguous array; the caller keeps `v` alive."""
    return v.ctypes.data


def _out(channels):
    return np.empty(channels, dtype=np.float64)


def _same_size(channels, *arrays):
    for a in arrays:
        if a.size != channels:
            raise _invalid(f"vectors of {a.size} and {channels} elements")


def _arrays(handle):
    """{name: array} of a bnps_arrays handle, which it frees."""
    try:
        out = {}
        for i in range(_lib.bnps_arrays_size(handle)):
            ndim = _lib.bnps_arrays_ndim(handle, i)
            shape = (c_int64 * max(ndim, 1))()
            _lib.bnps_arrays_shape(handle, i, shape)
            dtype = np.float32 if _lib.bnps_arrays_itemsize(handle, i) == 4 \
                else np.float64
            a = np.empty(tuple(shape[:ndim]), dtype=dtype)
            _lib.bnps_arrays_copy(handle, i, a.ctypes.data)
            out[_lib.bnps_arrays_name(handle, i).decode()] = a
        return out
    finally:
        _lib.bnps_arrays_free(handle)


class _Params:
    """{name: float32 array} as the C ABI's parallel arrays; keeps the
    buffers alive as long as it lives."""

    def __init__(self, params):
        self.arrays = [np.ascontiguousarray(v, dtype=np.float32)
                       for v in params.values()]
        self.n = len(self.arrays)
        self.names = (c_char_p * max(self.n, 1))(
            *[str(k).encode() for k in params.keys()])
        self.ndims = (c_int * max(self.n, 1))(*[a.ndim for a in self.arrays])
        dims = [d for a in self.arrays for d in a.shape]
        self.shapes = (c_int64 * max(len(dims), 1))(*dims)
        self.data = (c_void_p * max(self.n, 1))(
            *[a.ctypes.data for a in self.arrays])

    def args(self):
        return (self.n, self.names, self.ndims, self.shapes, self.data)


class Client:
    """One worker's connection (bnps_client), which bnps.client wraps."""

    def __init__(self, servers, job, worker, num_workers, token_file="",
                 tls_ca="", tls_cert="", tls_key="", connect_timeout_s=30.0,
                 rpc_timeout_s=30.0, bn_spin_us=-1, bn_host_aggregator=""):
        h = c_void_p()
        _call(_lib.bnps_client_connect3, ",".join(servers).encode(),
              job.encode(), int(worker), int(num_workers),
              token_file.encode(), tls_ca.encode(), tls_cert.encode(),
              tls_key.encode(), float(connect_timeout_s), float(rpc_timeout_s),
              int(bn_spin_us), bn_host_aggregator.encode(), ctypes.byref(h))
        self._h = h

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and _lib is not None:
            _lib.bnps_client_free(h)

    def close(self):
        _lib.bnps_client_close(self._h)

    @property
    def closed(self):
        return bool(_lib.bnps_client_closed(self._h))

    def config(self):
        buf = ctypes.create_string_buffer(8192)
        _call(_lib.bnps_client_config_json, self._h, buf, len(buf))
        return json.loads(buf.value.decode())

    def serve_metrics(self, host="127.0.0.1", port=0):
        """bnps_client_serve_metrics: the port it serves on."""
        bound = c_int()
        _call(_lib.bnps_client_serve_metrics, self._h, host.encode(),
              int(port), ctypes.byref(bound))
        return bound.value

    def metrics_text(self):
        """bnps_client_metrics_text: the Prometheus text exposition."""
        needed = c_size_t(1 << 14)
        for _ in range(3):  # the text may grow between two calls
            buf = ctypes.create_string_buffer(needed.value)
            try:
                _call(_lib.bnps_client_metrics_text, self._h, buf, len(buf),
                      ctypes.byref(needed))
                return buf.value.decode()
            except errors.BnpsError as e:
                if e.code_name != "RESOURCE_EXHAUSTED":
                    raise
        raise errors.from_native(Error(8, "RESOURCE_EXHAUSTED",
                                       "the metrics kept growing"))

    def live_workers(self):
        cap = 4096
        ids, n = (c_int * cap)(), c_int()
        _call(_lib.bnps_client_live_workers, self._h, ids, cap,
              ctypes.byref(n))
        return list(ids[:min(n.value, cap)])

    def bn_forward(self, layer, step, count, mean, m2, want_running=False):
        mean, m2 = _f64(mean, "mean"), _f64(m2, "m2")
        c = mean.size
        _same_size(c, m2)
        n, contributors, has_running = c_int64(), c_int(), c_int()
        g_mean, g_m2, r_mean, r_var = _out(c), _out(c), _out(c), _out(c)
        _call(_lib.bnps_client_bn_forward, self._h, layer.encode(), int(step),
              int(count), _ptr(mean), _ptr(m2), c, int(bool(want_running)),
              ctypes.byref(n), _ptr(g_mean), _ptr(g_m2),
              ctypes.byref(has_running), _ptr(r_mean), _ptr(r_var),
              ctypes.byref(contributors))
        if not has_running.value:
            r_mean = r_var = None
        return n.value, g_mean, g_m2, r_mean, r_var, contributors.value

    def bn_backward(self, layer, step, sum_dy, sum_dy_xhat):
        a, b = _f64(sum_dy, "sum_dy"), _f64(sum_dy_xhat, "sum_dy_xhat")
        _same_size(a.size, b)
        oa, ob = _out(a.size), _out(a.size)
        _call(_lib.bnps_client_bn_backward, self._h, layer.encode(), int(step),
              _ptr(a), _ptr(b), a.size, _ptr(oa), _ptr(ob))
        return oa, ob

    def bn_recal(self, layer, batch, count, mean, m2):
        mean, m2 = _f64(mean, "mean"), _f64(m2, "m2")
        _same_size(mean.size, m2)
        _call(_lib.bnps_client_bn_recal, self._h, layer.encode(), int(batch),
              int(count), _ptr(mean), _ptr(m2), mean.size)

    def bn_recal_finish(self, layer):
        h = c_void_p()
        _call(_lib.bnps_client_bn_recal_finish, self._h, layer.encode(),
              ctypes.byref(h))
        a = _arrays(h)
        return a["mean"], a["var"]

    def bn_local_running(self, layer, mean, var):
        mean, var = _f64(mean, "mean"), _f64(var, "var")
        _same_size(mean.size, var)
        om, ov = _out(mean.size), _out(mean.size)
        _call(_lib.bnps_client_bn_local_running, self._h, layer.encode(),
              _ptr(mean), _ptr(var), mean.size, _ptr(om), _ptr(ov))
        return om, ov

    def bn_running(self, layer, channels):
        om, ov = _out(int(channels)), _out(int(channels))
        _call(_lib.bnps_client_bn_running, self._h, layer.encode(),
              int(channels), _ptr(om), _ptr(ov))
        return om, ov

    def init_parameters(self, params):
        p = _Params(params)
        _call(_lib.bnps_client_init_parameters, self._h, *p.args())

    def push_gradients(self, step, num_samples, grads):
        p = _Params(grads)
        _call(_lib.bnps_client_push_gradients, self._h, int(step),
              int(num_samples), *p.args())

    def pull_parameters(self, min_version, keys=()):
        keys = [str(k).encode() for k in keys]
        arr = (c_char_p * max(len(keys), 1))(*keys)
        h = c_void_p()
        _call(_lib.bnps_client_pull, self._h, int(min_version), len(keys),
              arr, ctypes.byref(h))
        return _arrays(h)

    def start_step(self, step):
        out = c_int64()
        _call(_lib.bnps_client_start_step, self._h, int(step),
              ctypes.byref(out))
        return out.value

    def finish_step(self, completed):
        _call(_lib.bnps_client_finish_step, self._h, int(completed))

    def begin_step(self, step):
        """start_step under async gradients; `step` at once under sync
        (the C ABI applies the job's rule)."""
        out = c_int64()
        _call(_lib.bnps_client_begin_step, self._h, int(step),
              ctypes.byref(out))
        return out.value

    def end_step(self, completed):
        """finish_step under async gradients; nothing under sync."""
        _call(_lib.bnps_client_end_step, self._h, int(completed))

    def leave(self):
        _call(_lib.bnps_client_leave, self._h)


def export(servers, path, job="bnps", token_file="", tls_ca="", tls_cert="",
           tls_key="", timeout_s=30.0):
    """bnps_export: the job's state to `path` (safetensors); its summary."""
    buf = ctypes.create_string_buffer(1024)
    _call(_lib.bnps_export, ",".join(servers).encode(), str(path).encode(),
          job.encode(), token_file.encode(), tls_ca.encode(), tls_cert.encode(),
          tls_key.encode(), float(timeout_s), buf, len(buf))
    return json.loads(buf.value.decode())


# What a layer does with its running statistics after a forward pass
# (WorkerBn.resolve) and how they are settled after training (settle).
RUNNING_NONE, RUNNING_FROM_BATCH, RUNNING_FROM_SERVERS = 0, 1, 2
SETTLE_NOTHING, SETTLE_WORKERS_AVERAGE, SETTLE_SERVERS = 0, 1, 2


class WorkerBn:
    """The worker side of the job's BN policy (client/worker_bn.h): the C++
    worker's rules, which bnps.torch follows."""

    def __init__(self, policy, job_bn_momentum):
        h = c_void_p()
        _call(_lib.bnps_worker_bn_new, str(policy).encode(),
              float(job_bn_momentum), ctypes.byref(h))
        self._h = h
        self._plans = {}  # the rule is immutable: plan_forward's answers

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and _lib is not None:
            _lib.bnps_worker_bn_free(h)

    def check_layer(self, layer, tracks_running, momentum):
        _call(_lib.bnps_worker_bn_check_layer, self._h, str(layer).encode(),
              int(bool(tracks_running)), int(momentum is not None),
              0.0 if momentum is None else float(momentum))

    def plan_forward(self, tracks_running):
        """(exchange, want_running): whether to call bn_forward, and with
        want_running."""
        tracks_running = bool(tracks_running)
        plan = self._plans.get(tracks_running)
        if plan is None:
            exchange, want = c_int(), c_int()
            _lib.bnps_worker_bn_plan_forward(self._h, int(tracks_running),
                                             ctypes.byref(exchange),
                                             ctypes.byref(want))
            plan = self._plans[tracks_running] = (bool(exchange.value),
                                                  bool(want.value))
        return plan

    def resolve(self, count, mean, m2, answer=None):
        """(count, mean, m2) to normalize with, whether the backward pass
        exchanges, and RUNNING_*; `answer` is bn_forward's tuple, or None."""
        mean, m2 = _f64(mean, "mean"), _f64(m2, "m2")
        c = mean.size
        _same_size(c, m2)
        if answer is None:
            a_count, a_mean, a_m2, a_running = 0, _out(c), _out(c), 0
        else:
            a_count = answer[0]
            a_mean, a_m2 = _f64(answer[1], "mean"), _f64(answer[2], "m2")
            _same_size(c, a_mean, a_m2)
            a_running = int(answer[3] is not None)
        n, backward, running = c_int64(), c_int(), c_int()
        o_mean, o_m2 = _out(c), _out(c)
        _call(_lib.bnps_worker_bn_resolve, self._h, int(count), _ptr(mean),
              _ptr(m2), c, int(answer is not None), int(a_count),
              _ptr(a_mean), _ptr(a_m2), a_running, ctypes.byref(n),
              _ptr(o_mean), _ptr(o_m2), ctypes.byref(backward),
              ctypes.byref(running))
        return n.value, o_mean, o_m2, bool(backward.value), running.value

    def settle(self):
        out = c_int()
        _call(_lib.bnps_worker_bn_settle, self._h, ctypes.byref(out))
        return out.value


def update_running(count, mean, m2, momentum, batches_tracked, running_mean,
                   running_var):
    """client::UpdateRunning: returns (batches_tracked, running_mean,
    running_var) after the update (float64 arrays)."""
    mean, m2 = _f64(mean, "mean"), _f64(m2, "m2")
    rm = np.array(running_mean, dtype=np.float64)
    rv = np.array(running_var, dtype=np.float64)
    _same_size(mean.size, m2, rm, rv)
    tracked = c_int64(int(batches_tracked))
    _call(_lib.bnps_update_running, int(count), _ptr(mean), _ptr(m2),
          mean.size, int(momentum is not None),
          0.0 if momentum is None else float(momentum), ctypes.byref(tracked),
          _ptr(rm), _ptr(rv))
    return tracked.value, rm, rv


def merge_moments(count_a, mean_a, m2_a, count_b, mean_b, m2_b):
    """merge(a, b), a first (bn::MergeInto): (count, mean, m2)."""
    ma, m2a = _f64(mean_a, "mean"), _f64(m2_a, "m2")
    mb, m2b = _f64(mean_b, "mean"), _f64(m2_b, "m2")
    if not (ma.size == m2a.size and mb.size == m2b.size):
        raise _invalid("mean and m2 of different sizes")
    if ma.size != mb.size:
        raise _invalid("moments of different channel counts")
    n, om, om2 = c_int64(), _out(ma.size), _out(ma.size)
    _call(_lib.bnps_merge_moments, int(count_a), _ptr(ma), _ptr(m2a),
          int(count_b), _ptr(mb), _ptr(m2b), ma.size, ctypes.byref(n),
          _ptr(om), _ptr(om2))
    return n.value, om, om2


def layer_forward(rule, client, layer, step, x, n, channels, spatial, weight,
                  bias, eps, momentum, running_mean, running_var,
                  batches_tracked, num_threads, y, stats, info):
    """bnps_layer_forward on the caller's float32 memory: x, weight, bias,
    running_mean, running_var, batches_tracked (int64), y, stats (float64,
    2 x channels) and info (int64, 3) are addresses (None: NULL) the caller
    keeps valid; `rule` a WorkerBn, `client` a Client or None."""
    _call(_lib.bnps_layer_forward, rule._h,
          None if client is None else client._h, layer.encode(), step, x, n,
          channels, spatial, weight, bias, eps, momentum is not None,
          0.0 if momentum is None else momentum, running_mean, running_var,
          batches_tracked, num_threads, y, stats, info)


def layer_exchange_forward(rule, client, layer, step, count, mean, m2,
                           channels, momentum, running_mean, running_var,
                           batches_tracked, stats, info):
    """bnps_layer_exchange_forward: mean and m2 (float64, `channels`), the
    float64 running_mean and running_var (updated in place), batches_tracked
    (int64), stats (float64, 2 x channels) and info (int64, 3) are
    addresses (None: NULL) the caller keeps valid; `rule` a WorkerBn,
    `client` a Client or None."""
    _call(_lib.bnps_layer_exchange_forward, rule._h,
          None if client is None else client._h, layer.encode(), step, count,
          mean, m2, channels, momentum is not None,
          0.0 if momentum is None else momentum, running_mean, running_var,
          batches_tracked, stats, info)


def layer_exchange_backward(client, layer, step, sum_dy, sum_dy_xhat,
                            channels, count, stats, weight, eps, k):
    """bnps_layer_exchange_backward: sum_dy, sum_dy_xhat, stats (2 x
    channels), weight and k (3 x channels) are float64 addresses (None:
    NULL) the caller keeps valid; `layer` empty: no exchange (no client
    needed)."""
    _call(_lib.bnps_layer_exchange_backward,
          None if client is None else client._h, layer.encode(), step, sum_dy,
          sum_dy_xhat, channels, count, stats, weight, eps, k)


def layer_backward(client, layer, step, dy, x, n, channels, spatial, weight,
                   count, stats, eps, num_threads, dx, dweight, dbias):
    """bnps_layer_backward, addresses as layer_forward's; `layer` empty: the
    local sums only (no client needed)."""
    _call(_lib.bnps_layer_backward, None if client is None else client._h,
          layer.encode(), step, dy, x, n, channels, spatial, weight, count,
          stats, eps, num_threads, dx, dweight, dbias)


class LayerPass(ctypes.Structure):
    """bnps_layer_pass: a layer's arguments to layer_pass_forward and
    layer_pass_backward, made once and kept; addresses are ints (0: NULL)
    the caller keeps valid, `layer` bytes the caller keeps alive."""
    _fields_ = [
        ("rule", c_void_p), ("client", c_void_p), ("layer", c_char_p),
        ("step", c_int64), ("x", c_void_p), ("n", c_int64),
        ("channels", c_int64), ("spatial", c_int64), ("weight", c_void_p),
        ("eps", c_double), ("num_threads", c_int64), ("bias", c_void_p),
        ("has_momentum", c_int64), ("momentum", c_double),
        ("running_mean", c_void_p), ("running_var", c_void_p),
        ("batches_tracked", c_void_p), ("y", c_void_p), ("stats", c_void_p),
        ("info", c_int64 * 3), ("dy", c_void_p), ("count", c_int64),
        ("dx", c_void_p), ("dweight", c_void_p), ("dbias", c_void_p)]

    def set_rule(self, rule, client):
        """The forward's WorkerBn and the Client (None: no exchange)."""
        self.rule = rule._h.value
        self.client = None if client is None else client._h.value


class DeviceCall(ctypes.Structure):
    """bnps_device_call: a device pass's arguments to
    bnps_device_call_forward and bnps_device_call_backward, made once and
    kept; addresses are ints (0: NULL) the caller keeps valid. Called
    straight from ctypes (_device_route.py), with the error buffer's
    address: `err` and `err_at` (bnps._library.ERR_LEN bytes, the block's
    own: its layer's passes run one at a time)."""
    _fields_ = [
        ("pass_", c_void_p), ("stream", c_void_p), ("count", c_int64),
        ("mean", c_void_p), ("invstd", c_void_p), ("count_out", c_void_p),
        ("exchanges", c_int64), ("backward_exchanges", c_int64),
        ("captured", c_int64), ("sum_dy", c_void_p),
        ("sum_dy_xmu", c_void_p)]

    def __init__(self, device_pass):
        super().__init__()
        self.pass_ = device_pass
        self.err = ctypes.create_string_buffer(_ERR_LEN)
        self.err_at = ctypes.addressof(self.err)


def layer_pass_forward(address):
    """bnps_layer_pass_forward on the LayerPass at `address` (its
    ctypes.addressof)."""
    _call(_lib.bnps_layer_pass_forward, address)


def layer_pass_backward(address):
    """bnps_layer_pass_backward on the LayerPass at `address`."""
    _call(_lib.bnps_layer_pass_backward, address)


class Outcome:
    """What a queued forward normalized with (bnps_outcome), for its
    backward pass."""

    def __init__(self, handle):
        self._h = handle

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and _lib is not None:
            _lib.bnps_outcome_free(h)


class StreamQueue:
    """bnps_stream_queue: exchanges run in a CUDA stream's order (on_cuda),
    or each inside the call that queues it. Addresses are the caller's and
    must stay valid until the job has run (drain, or the stream
    synchronized); `stream` a cudaStream_t as an int (0: the legacy default
    stream)."""

    def __init__(self, on_cuda):
        h = c_void_p()
        _call(_lib.bnps_stream_queue_new, int(bool(on_cuda)), ctypes.byref(h))
        self._h = h
        self.on_cuda = bool(on_cuda)

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and _lib is not None:
            _lib.bnps_stream_queue_free(h)

    def drain(self, timeout_s):
        """Waits for the queued jobs; raises the first failure of one."""
        _call(_lib.bnps_stream_queue_drain, self._h, float(timeout_s))

    def counts(self):
        """(queued and not yet run, run, fell back)."""
        out = (c_int64 * 3)()
        _lib.bnps_stream_queue_counts(self._h, out)
        return tuple(out)

    def forward(self, stream, rule, client, layer, step, count, local,
                channels, eps, momentum, running_mean, running_var,
                batches_tracked, rows, running, tracked_out):
        """bnps_stream_queue_forward. local, rows and running are
        (address, itemsize) pairs (running None: the layer tracks none);
        the rest are addresses. Returns (Outcome, exchanges, global
        backward)."""
        info = (c_int64 * 2)()
        h = c_void_p()
        running = running or (None, 8)
        _call(_lib.bnps_stream_queue_forward, self._h, stream, rule._h,
              None if client is None else client._h, layer.encode(), step,
              count, local[0], local[1], channels, eps, momentum is not None,
              0.0 if momentum is None else momentum, running_mean,
              running_var, batches_tracked, rows[0], rows[1], running[0],
              running[1], tracked_out, ctypes.addressof(info),
              ctypes.byref(h))
        return Outcome(h), bool(info[0]), bool(info[1])

    def backward(self, stream, client, layer, step, sums, has_weight,
                 channels, outcome, eps, k):
        """bnps_stream_queue_backward: sums and k (address, itemsize)
        pairs, k None for the exchange alone."""
        k = k or (None, 8)
        _call(_lib.bnps_stream_queue_backward, self._h, stream,
              None if client is None else client._h, layer.encode(), step,
              sums[0], sums[1], int(bool(has_weight)), channels,
              None if outcome is None else outcome._h, eps, k[0], k[1])
