"""The FUSED route of a bnps.torch.SyncBatchNorm training pass (_routes.py
chooses it; CUDA's default): torch's fused batch-norm kernels, the four
that torch.nn.SyncBatchNorm itself runs, around ONE native call per pass.

    forward   torch.batch_norm_stats(x, 0)    the local mean and
                                              1 / sqrt(biased var), one
                                              kernel (float32 accumulation
                                              for 16-bit input; any of
                                              NCHW and channels_last)
              bnps_device_pass_forward        queues on the stream: their
                                              copy to pinned host buffers,
                                              the exchange as a host
                                              function (the policy's rule;
                                              running statistics in float64
                                              on the host), the copies back
                                              of the mean and 1/sqrt(var +
                                              eps) to normalize with, of the
                                              count, and of the running
                                              statistics straight into the
                                              layer's buffers
              torch.batch_norm_elemt          y
    backward  torch.batch_norm_backward_reduce  sum(dy), sum(dy (x - mean)),
                                              dweight, dbias (local)
              bnps_device_pass_backward       where the policy's backward
                                              merges: the two sums' copy,
                                              exchange, copy back
              torch.batch_norm_backward_elemt dx

The host queues and returns: nothing here waits for the device (the layer
reads its running statistics to the host once, when its DevicePlan is made,
and the connection counts that wait: Connection.host_waits). The native
pass keeps the step counters and the running statistics, advanced by the
exchange when it RUNS, so a step captured in a CUDA graph replays as a new
step for the servers.

These kernels exist on CUDA only. On the CPU (the tests, with
stream_exchange on) CpuKernels stands in for them with CPU torch operations
computing the same quantities, and the native calls run their jobs inline:
the same native code path, device memory being host memory there.
"""

import ctypes
import warnings

import torch

from bnps import _native
from bnps import errors
from bnps.torch import channels as channels_

_lib = _native._lib
_c = ctypes
_P = _c.c_void_p

_STATS_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_ITEMSIZE = {torch.float32: 4, torch.float64: 8}


def host_waits(queue):
    """(the layers' waits, the drains that waited) of a
    bnps._native.StreamQueue (bnps_stream_queue_waits)."""
    out = (_c.c_int64 * 2)()
    _lib.bnps_stream_queue_waits(queue._h, out)
    return tuple(out)


def exchange_seconds(queue):
    """Seconds a bnps._native.StreamQueue's jobs spent in their exchanges
    (bnps_stream_queue_exchange_seconds)."""
    return _lib.bnps_stream_queue_exchange_seconds(queue._h)


def note_wait(queue):
    """Counts a wait of a layer for the device (bnps_stream_queue_note_wait).
    """
    _lib.bnps_stream_queue_note_wait(queue._h)


class RecordingQueue(_native.StreamQueue):
    """The tests' stand-in for a CUDA stream capturing a graph
    (bnps_stream_queue_new_recording): a CPU queue whose copies and jobs
    are recorded while recording, and replayed by record()."""

    def __init__(self):  # (not StreamQueue's: another constructor)
        h = _P()
        _native._call(_lib.bnps_stream_queue_new_recording, _c.byref(h))
        self._h = h
        self.on_cuda = False

    def record(self, on, replays=0):
        """Recording on or off, then `replays` replays of what it
        recorded."""
        _native._call(_lib.bnps_stream_queue_record, self._h, int(on),
                      replays)


class CpuKernels:
    """torch's four fused batch-norm kernels, which exist on CUDA only, as
    CPU torch operations computing the same quantities (same arguments,
    same outputs, accumulating as channels.acc_dtype says): used only where
    the input is on the CPU."""

    @staticmethod
    def batch_norm_stats(x, eps):
        xa = x.to(channels_.acc_dtype(x.dtype))
        var, mean = channels_.var_mean(xa, channels_.reduce_dims(x))
        return mean, torch.rsqrt(var + eps)

    @staticmethod
    def batch_norm_elemt(x, weight, bias, mean, invstd, eps):
        shape = channels_.channel_shape(x)
        xa = x.to(mean.dtype)
        y = (xa - mean.view(shape)) * invstd.view(shape)
        if weight is not None:
            y = y * weight.to(mean.dtype).view(shape)
        if bias is not None:
            y = y + bias.to(mean.dtype).view(shape)
        return y.to(x.dtype)

    @staticmethod
    def batch_norm_backward_reduce(dy, x, mean, invstd, weight, input_g,
                                   weight_g, bias_g):
        shape, dims = channels_.channel_shape(x), channels_.reduce_dims(x)
        dya = dy.to(mean.dtype)
        sum_dy = dya.sum(dims)
        sum_dy_xmu = (dya * (x.to(mean.dtype) - mean.view(shape))).sum(dims)
        dweight = dbias = None
        if weight_g:
            dweight = (sum_dy_xmu * invstd).to(weight.dtype)
        if bias_g:  # (its own tensor, as the kernel's: sum_dy is merged)
            dbias = sum_dy.to(weight.dtype, copy=True)
        if not input_g:
            sum_dy = sum_dy_xmu = None
        return sum_dy, sum_dy_xmu, dweight, dbias

    @staticmethod
    def batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy,
                                  sum_dy_xmu, count):
        shape = channels_.channel_shape(x)
        n = count.sum().to(mean.dtype)
        mean_dy, mean_dy_xmu = sum_dy / n, sum_dy_xmu / n
        k = invstd if weight is None else invstd * weight.to(mean.dtype)
        xmu = x.to(mean.dtype) - mean.view(shape)
        dx = dy.to(mean.dtype) - mean_dy.view(shape) - \
            xmu * (invstd * invstd * mean_dy_xmu).view(shape)
        return (dx * k.view(shape)).to(x.dtype)


def kernels(x):
    """The module with the four kernels for x: torch on CUDA, else the
    stand-in."""
    return torch if x.is_cuda else CpuKernels


def blocker(bn, x, connection):
    """None where FUSED can take a training pass of `bn` on `x` through
    `connection` (which queues on x's device), else why not: "" for an
    empty batch (QUEUED takes it without a warning), a message otherwise
    (the layer warns it once)."""
    if x.numel() == 0:
        return ""
    if x.device.type not in ("cuda", "cpu"):
        return f"{x.device.type} input takes torch operations"
    if x.dtype not in _STATS_DTYPES:
        return f"{x.dtype} input takes torch operations"
    if not _laid_out(x):
        return ("input that is neither contiguous nor channels_last takes "
                "torch operations; pass x.contiguous() to avoid it")
    rm = bn._buffers.get("running_mean")
    if rm is not None:
        rv = bn._buffers.get("running_var")
        if rm.dtype not in _ITEMSIZE or rv.dtype != rm.dtype or \
                not (rm.is_contiguous() and rv.is_contiguous()):
            return (f"{rm.dtype} running statistics take the queued route "
                    f"(the fused one writes float32 or float64 buffers)")
    why = getattr(connection.exchange_queue(x.device), "_bnps_unfused", None)
    return why


def _laid_out(x):
    """x in an order the kernels read: contiguous, or channels_last."""
    if x.is_contiguous():
        return True
    fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
    return fmt is not None and x.is_contiguous(memory_format=fmt)


class FusedStats:
    """What a FUSED forward normalized with, for its backward: the mean and
    1 / sqrt(var + eps) (device, views of one 2 x C tensor), the count (a
    device int32), and its plan."""

    __slots__ = ("mean", "invstd", "count", "plan", "layer", "local",
                 "sums")

    def __init__(self, mean, invstd, count, plan, layer):
        self.mean, self.invstd, self.count, self.plan = \
            mean, invstd, count, plan
        # The local statistics and the backward's merged sums, kept as long
        # as these statistics (the replays of a captured graph copy them).
        self.local = self.sums = None
        self.layer = layer  # the layer's name where the backward merges


class DevicePass:
    """bnps_device_pass: a layer's native passes on a queue."""

    def __init__(self, queue, rule, client, layer, channels, eps, momentum,
                 itemsize, running, outs, steps):
        h = _P()
        rm, rv, tracked = running or (None, None, None)
        rm_out, rv_out, tracked_out, running_itemsize = outs or \
            (None, None, None, 8)
        _native._call(
            _lib.bnps_device_pass_new, queue._h, rule._h,
            None if client is None else client._h, layer.encode(), channels,
            eps, momentum is not None, 0.0 if momentum is None else momentum,
            itemsize, rm, rv, tracked, rm_out, rv_out, running_itemsize,
            tracked_out, steps[0], steps[1], _c.byref(h))
        self._h = h
        self.queue = queue  # (a pass must not outlive its queue)

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h and _lib is not None:
            _lib.bnps_device_pass_free(h)

    def steps(self):
        """(next forward step, next backward step) as the jobs left them."""
        out = (_c.c_int64 * 2)()
        _lib.bnps_device_pass_steps(self._h, out)
        return tuple(out)


# The current stream's handle without making a torch.cuda.Stream (which
# costs the host more than the rest of a pass's bookkeeping); torch < 2.0
# lacks it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(device):
    """The current stream's handle for the C ABI (an int), None off CUDA
    (the fused and the queued routes' passes queue on it)."""
    if device.type != "cuda":
        return None
    if _raw_stream is not None:
        return _raw_stream(device.index)
    return torch.cuda.current_stream(device).cuda_stream


class DevicePlan:
    """A layer's FUSED passes for its configuration: the DevicePass (made
    with the layer's running statistics read once to the host), and the
    key it holds for."""

    __slots__ = ("owner", "key", "steps", "device_pass", "info", "keep",
                 "captured", "checked")

    def __init__(self, bn, x, connection, rule, stats_dtype, key):
        queue = connection.exchange_queue(x.device)
        buffers = bn._buffers
        rm, rv = buffers.get("running_mean"), buffers.get("running_var")
        bn._check_named(rule, rm is not None)
        if bn.bnps_name:
            connection.claim_layer_name(bn)
        running = outs = None
        keep = []
        if rm is not None:
            tracked = buffers["num_batches_tracked"]
            note_wait(queue)  # the one wait: the buffers read to the host
            host = (rm.detach().to("cpu", torch.float64),
                    rv.detach().to("cpu", torch.float64),
                    tracked.detach().to("cpu", torch.int64).reshape(1))
            keep += list(host) + [rm, rv, tracked]
            running = tuple(t.data_ptr() for t in host)
            outs = (rm.data_ptr(), rv.data_ptr(), tracked.data_ptr(),
                    _ITEMSIZE[rm.dtype])
        self.device_pass = DevicePass(
            queue, rule, connection.client.native, bn.bnps_name or "",
            x.shape[1], bn.eps, bn.momentum, _ITEMSIZE[stats_dtype], running,
            outs, (bn._bnps_step, bn._bnps_backward_step))
        self.owner, self.key, self.keep = bn, key, keep
        # The layer's step counters as its passes on this plan left them
        # (another route's pass advances them: a new plan then).
        self.steps = (bn._bnps_step, bn._bnps_backward_step)
        self.info = (_c.c_int64 * 3)()
        self.captured = False
        self.checked = False  # holds() found it holds for the next pass


def _key(bn, x, connection, stats_dtype):
    """What of the layer and pass a DevicePlan depends on (with its step
    counters: DevicePlan.steps): its running buffers as
    SyncBatchNorm._running_key names them (their addresses and versions:
    a write the layer did not make changes them), read here from the
    buffers' dict (per pass: a module's attribute costs a lookup)."""
    d, b = bn.__dict__, bn._buffers
    rm = b.get("running_mean")
    running = None
    if rm is not None:
        rv, t = b["running_var"], b["num_batches_tracked"]
        running = (rm.data_ptr(), rm._version, rv.data_ptr(), rv._version,
                   t.data_ptr(), t._version)
    return (connection, connection.stream_exchange, x.device, x.shape[1],
            stats_dtype, d["eps"], d["momentum"], d["bnps_name"], running)


def holds(bn, x, connection):
    """Whether a training pass of `bn` on `x` takes FUSED on the layer's
    plan at once, as _routes.choose would (the plan marked so for this
    pass): the same layer, connection and configuration, steps and running
    buffers as the plan was made for, non-empty input of the plan's
    statistics' dtype laid out for the kernels, no recalibration, the
    fused route still open on the queue, and for CUDA input its device
    the current one (else the table raises RouteError)."""
    plan = bn.__dict__.get("_bnps_device_plan")
    if plan is None or plan.owner is not bn or bn._recal_batch is not None \
            or x.numel() == 0 or not _laid_out(x) or \
            getattr(plan.device_pass.queue, "_bnps_unfused", None) \
            is not None or \
            (x.is_cuda and x.device.index != torch.cuda.current_device()):
        return False
    stats = torch.float64 if x.dtype == torch.float64 else \
        torch.float32 if x.dtype in _STATS_DTYPES else None
    plan.checked = plan.steps == (bn._bnps_step, bn._bnps_backward_step) \
        and plan.key == _key(bn, x, connection, stats)
    return plan.checked


def leave(bn):
    """Before a pass of `bn` on another route: where its plan's jobs were
    captured in a CUDA graph, whose replays advanced the native step
    counters, the layer's counters from them (once the queued jobs have
    run: a wait), and the plan dropped."""
    plan = bn.__dict__.get("_bnps_device_plan")
    if plan is None or not plan.captured or plan.owner is not bn:
        return
    note_wait(plan.device_pass.queue)
    bn._connection().drain_exchanges()
    bn._bnps_step, bn._bnps_backward_step = plan.device_pass.steps()
    del bn.__dict__["_bnps_device_plan"]


def _plan(bn, x, connection, rule, stats_dtype):
    """The layer's DevicePlan for this pass, made where none holds."""
    d = bn.__dict__
    plan = d.get("_bnps_device_plan")
    if plan is not None and plan.checked:  # (holds() checked it just now)
        plan.checked = False
        return plan
    key = _key(bn, x, connection, stats_dtype)
    if plan is not None and plan.owner is bn and plan.key == key and \
            plan.steps == (bn._bnps_step, bn._bnps_backward_step):
        return plan
    if plan is not None and plan.captured:  # its steps, then a new plan
        leave(bn)
        key = _key(bn, x, connection, stats_dtype)
    plan = d["_bnps_device_plan"] = DevicePlan(bn, x, connection, rule,
                                               stats_dtype, key)
    return plan


def forward(bn, x, weight, bias, eps, rule, fallback):
    """A FUSED training forward of `bn` on `x` under `rule` (the
    connection's bnps._native.WorkerBn): (y, FusedStats).
    `fallback(bn, x, weight, bias, eps)` runs the pass instead where the
    CUDA driver lacks the device passes' calls (said once, then QUEUED
    takes the layers: blocker)."""
    k = kernels(x)
    connection = bn._connection()
    mean, invstd = k.batch_norm_stats(x, 0.0)  # 1 / sqrt(var): inf for 0
    try:
        plan = _plan(bn, x, connection, rule, mean.dtype)
    except errors.Unavailable as e:
        queue = connection.exchange_queue(x.device)
        queue._bnps_unfused = f"the fused route is unavailable: {e}"
        warnings.warn(f"bnps SyncBatchNorm: {queue._bnps_unfused}; layers "
                      f"take the queued route", stacklevel=3)
        return fallback(bn, x, weight, bias, eps)
    channels = x.shape[1]
    rows = torch.empty((2, channels), dtype=mean.dtype, device=x.device)
    count = torch.empty(1, dtype=torch.int32, device=x.device)
    info = plan.info
    _native._call(_lib.bnps_device_pass_forward, plan.device_pass._h,
                  current_stream(x.device), x.numel() // channels,
                  mean.data_ptr(), invstd.data_ptr(), rows.data_ptr(),
                  count.data_ptr(), _c.addressof(info))
    d = bn.__dict__  # (nn.Module's __setattr__ costs ~10 us)
    d["_bnps_step"] += info[0]
    if info[2]:  # captured: its replays advance the steps
        plan.captured = True
    plan.steps = (d["_bnps_step"], plan.steps[1])
    r_mean, r_invstd = rows.unbind(0)
    y = k.batch_norm_elemt(x, weight, bias, r_mean, r_invstd, eps)
    stats = FusedStats(r_mean, r_invstd, count, plan,
                       bn.bnps_name if info[1] else None)
    stats.local = (mean, invstd)
    return y, stats


def backward(bn, x, weight, dy, stats, eps, need_dx):
    """(dx, dweight, dbias) of a FUSED forward's pass: dx None unless
    need_dx, dweight and dbias None without a weight."""
    k = kernels(x)
    if not _laid_out(dy):  # (as torch's SyncBatchNorm does)
        dy = dy.contiguous()
    mean, invstd = stats.mean, stats.invstd
    has_weight = weight is not None
    merges = stats.layer is not None
    sum_dy, sum_dy_xmu, dweight, dbias = k.batch_norm_backward_reduce(
        dy, x, mean, invstd, weight, need_dx or merges, has_weight,
        has_weight)
    if merges:
        plan = stats.plan
        _native._call(_lib.bnps_device_pass_backward, plan.device_pass._h,
                      current_stream(x.device), invstd.data_ptr(),
                      sum_dy.data_ptr(),
                      sum_dy_xmu.data_ptr())
        stats.sums = (sum_dy, sum_dy_xmu)
        d = bn.__dict__  # (nn.Module's __setattr__ costs ~10 us)
        d["_bnps_backward_step"] += 1
        if plan.steps[1] == d["_bnps_backward_step"] - 1:
            plan.steps = (plan.steps[0], d["_bnps_backward_step"])
    dx = None
    if need_dx:
        dx = k.batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy,
                                         sum_dy_xmu, stats.count)
    return dx, dweight, dbias
