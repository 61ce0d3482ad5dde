"""The FUSED route of a bnps.torch.SyncBatchNorm training pass (_routes.py
chooses it; CUDA's default): torch's fused batch-norm kernels, the four
that torch.nn.SyncBatchNorm itself runs, around ONE native call per pass.

    forward   torch.batch_norm_stats(x, 0)    the local mean and
                                              1 / sqrt(biased var), one
                                              kernel (float32 accumulation
                                              for 16-bit input; any of
                                              NCHW and channels_last)
              bnps_device_call_forward        queues on the stream: their
                                              copy to pinned host buffers,
                                              the exchange as a host
                                              function (the policy's rule;
                                              running statistics in float64
                                              on the host), the copies back
                                              of the mean and 1/sqrt(var +
                                              eps) to normalize with (over
                                              the kernel's outputs), of the
                                              count, and of the running
                                              statistics straight into the
                                              layer's buffers
              torch.batch_norm_elemt          y
    backward  torch.batch_norm_backward_reduce  sum(dy), sum(dy (x - mean)),
                                              dweight, dbias (local)
              bnps_device_call_backward       where the policy's backward
                                              merges: the two sums' copy,
                                              exchange, copy back
              torch.batch_norm_backward_elemt dx

Per pass the host makes one tensor (the count, as torch's SyncBatchNorm
does), writes the pass's addresses into the layer's call block and calls
the C function straight through ctypes; whether the layer's plan still
holds is a handful of identity and version comparisons (holds).

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
from bnps._library import ERR_LEN
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
    1 / sqrt(var + eps) (device: batch_norm_stats's own outputs, which the
    native pass overwrites in place), the count (a device int32), and its
    plan."""

    __slots__ = ("mean", "invstd", "count", "plan", "layer", "sums")

    def __init__(self, mean, invstd, count, plan, layer):
        self.mean, self.invstd, self.count, self.plan = \
            mean, invstd, count, plan
        self.layer = layer  # the layer's name where the backward merges
        # The backward's merged sums, kept as long as these statistics (the
        # replays of a captured graph copy them).
        self.sums = None


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
# costs the host more than the rest of a pass's bookkeeping), and the
# current device's index without torch.cuda.current_device's Python layers;
# torch < 2.0 lacks the first.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_index = getattr(torch._C, "_cuda_getDevice", None) or \
    (lambda: torch.cuda.current_device())
_stream_at = _raw_stream or \
    (lambda index: torch.cuda.current_stream(index).cuda_stream)


def current_stream(device):
    """The current stream's handle for the C ABI (an int), None off CUDA
    (the fused and the queued routes' passes queue on it)."""
    if device.type != "cuda":
        return None
    return _stream_at(device.index)


class DevicePlan:
    """A layer's FUSED passes for its configuration: the DevicePass (made
    with the layer's running statistics read once to the host) and its
    call block (bnps._native.DeviceCall), what they were made for (the
    connection, device, statistics' dtype, eps, momentum, name, running
    buffers and steps: _made_for), and the input they were last checked for
    (its dtype and layout: holds)."""

    __slots__ = ("owner", "connection", "device", "cuda_index", "stats_dtype",
                 "channels", "eps", "momentum", "name", "running", "step",
                 "backward_step", "x_dtype", "contiguous", "stream_exchange",
                 "queue", "device_pass", "call", "call_at", "keep",
                 "captured", "checked")

    def __init__(self, bn, x, connection, rule, stats_dtype):
        queue = connection.exchange_queue(x.device)
        d, buffers = bn.__dict__, bn._buffers
        rm, rv = buffers.get("running_mean"), buffers.get("running_var")
        bn._check_named(rule, rm is not None)
        if bn.bnps_name:
            connection.claim_layer_name(bn)
        running = outs = None
        keep = []
        self.running = None
        if rm is not None:
            tracked = buffers["num_batches_tracked"]
            note_wait(queue)  # the one wait: the buffers read to the host
            host = (rm.detach().to("cpu", torch.float64),
                    rv.detach().to("cpu", torch.float64),
                    tracked.detach().to("cpu", torch.int64).reshape(1))
            keep += list(host)
            running = tuple(t.data_ptr() for t in host)
            outs = (rm.data_ptr(), rv.data_ptr(), tracked.data_ptr(),
                    _ITEMSIZE[rm.dtype])
            # The buffers as written to (kept: no other tensor can take
            # their addresses), with their versions: a write the layer did
            # not make changes one (holds).
            self.running = (rm, rm._version, outs[0], rv, rv._version,
                            outs[1], tracked, tracked._version, outs[2])
        channels = x.shape[1]
        self.step, self.backward_step = \
            d["_bnps_step"], d["_bnps_backward_step"]
        self.device_pass = DevicePass(
            queue, rule, connection.client.native, d["bnps_name"] or "",
            channels, d["eps"], d["momentum"], _ITEMSIZE[stats_dtype],
            running, outs, (self.step, self.backward_step))
        self.owner, self.connection, self.queue, self.keep = \
            bn, connection, queue, keep
        self.device = x.device
        self.cuda_index = x.device.index if x.is_cuda else None
        self.stats_dtype, self.channels = stats_dtype, channels
        self.eps, self.momentum, self.name = \
            d["eps"], d["momentum"], d["bnps_name"]
        self.call = _native.DeviceCall(self.device_pass._h)
        self.call_at = _c.addressof(self.call)
        self.captured = False
        self.checked = False  # holds() found it holds for the next pass
        self.note(x)

    def note(self, x):
        """What holds() checks of a pass that the route table gave FUSED on
        this plan: x's dtype (float32 CPU input never: the table decides
        between the native call and this route, by the parameters' dtype
        and the layout) and layout, and the connection's stream_exchange
        (with this plan's queue made, whether the connection queues on the
        device follows from it: Connection.queues_on)."""
        self.x_dtype = None if x.dtype == torch.float32 and x.is_cpu else \
            x.dtype
        self.contiguous = x.is_contiguous()
        self.stream_exchange = self.connection.stream_exchange


def _made_for(plan, bn, connection, device, stats_dtype):
    """Whether `plan` holds for a pass of `bn` through `connection` with
    statistics of `stats_dtype` on `device`: what its DevicePass was made
    for (the running buffers: the same tensors, storage and versions; a
    write the layer did not make changes them)."""
    d = bn.__dict__
    return plan.owner is bn and plan.connection is connection and \
        plan.device == device and plan.stats_dtype is stats_dtype and \
        _same_layer(plan, d, bn._buffers)


def _same_layer(p, d, b):
    """The layer's own part of _made_for: steps, eps, momentum, name and
    running buffers (`d` its __dict__, `b` its _buffers)."""
    r = p.running
    if r is None:
        if b.get("running_mean") is not None:
            return False
    else:
        rm, rv, t = b.get("running_mean"), b.get("running_var"), \
            b.get("num_batches_tracked")
        if not (rm is r[0] and rm._version == r[1] and
                rm.data_ptr() == r[2] and rv is r[3] and
                rv._version == r[4] and rv.data_ptr() == r[5] and
                t is r[6] and t._version == r[7] and t.data_ptr() == r[8]):
            return False
    return d["_bnps_step"] == p.step and \
        d["_bnps_backward_step"] == p.backward_step and \
        d["eps"] == p.eps and d["momentum"] == p.momentum and \
        d["bnps_name"] == p.name


def holds(bn, x, connection):
    """Whether a training pass of `bn` on `x` through `connection` takes
    FUSED on the layer's plan at once, as _routes.choose would (the plan
    marked so for this pass), by identities and versions, no key built: the
    same layer in the state the plan was made for (_same_layer), x of the
    dtype and layout it was last checked for (note), non-empty, of the
    plan's channels and device, for CUDA input that device the current one
    (else the table raises RouteError); the same connection with the same
    stream_exchange, the fused route still open on its queue, no
    recalibration."""
    d = bn.__dict__
    p = d.get("_bnps_device_plan")
    if p is None or p.owner is not bn or x.dtype is not p.x_dtype or \
            x.is_contiguous() is not p.contiguous or \
            (not p.contiguous and not _laid_out(x)) or \
            x.numel() == 0 or x.shape[1] != p.channels or \
            connection is not p.connection or \
            connection.stream_exchange is not p.stream_exchange or \
            d["_recal_batch"] is not None or \
            getattr(p.queue, "_bnps_unfused", None) is not None:
        return False
    i = p.cuda_index
    if i is None:
        if not x.is_cpu:
            return False
    elif not x.is_cuda or x.get_device() != i or _current_index() != i:
        return False
    p.checked = _same_layer(p, d, bn._buffers)
    return p.checked


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


def _plan(bn, x, rule_of, stats_dtype):
    """The layer's DevicePlan for a pass the route table gave FUSED: its
    plan where that was made for the pass (noting x), else a new one
    (`rule_of(connection)`: the connection's bnps._native.WorkerBn)."""
    d = bn.__dict__
    plan = d.get("_bnps_device_plan")
    connection = bn._connection()
    if plan is not None and _made_for(plan, bn, connection, x.device,
                                      stats_dtype):
        plan.note(x)
        return plan
    if plan is not None and plan.captured:  # its steps, then a new plan
        leave(bn)
    plan = d["_bnps_device_plan"] = DevicePlan(
        bn, x, connection, rule_of(connection), stats_dtype)
    return plan


def forward(bn, x, weight, bias, eps, rule_of, fallback):
    """A FUSED training forward of `bn` on `x`: (y, FusedStats).
    `rule_of(connection)` gives the policy's rules where a plan is made;
    `fallback(bn, x, weight, bias, eps)` runs the pass instead where the
    CUDA driver lacks the device passes' calls (said once, then QUEUED
    takes the layers: blocker)."""
    k = torch if x.is_cuda else CpuKernels
    mean, invstd = k.batch_norm_stats(x, 0.0)  # 1 / sqrt(var): inf for 0
    d = bn.__dict__
    p = d.get("_bnps_device_plan")
    if p is None or not p.checked or mean.dtype is not p.stats_dtype:
        try:
            p = _plan(bn, x, rule_of, mean.dtype)
        except errors.Unavailable as e:
            queue = bn._connection().exchange_queue(x.device)
            queue._bnps_unfused = f"the fused route is unavailable: {e}"
            warnings.warn(f"bnps SyncBatchNorm: {queue._bnps_unfused}; "
                          f"layers take the queued route", stacklevel=3)
            return fallback(bn, x, weight, bias, eps)
    p.checked = False
    # The one allocation (torch's SyncBatchNorm makes its count too): the
    # native pass writes the mean and 1/std to normalize with over the
    # kernel's own outputs, in the stream's order.
    count = torch.empty(1, dtype=torch.int32, device=p.device)
    a = p.call
    # The current stream, read per pass (the plan holds none). The layer's
    # pinned host buffers (its DevicePass's) serve every pass: safe because
    # a pass's copies and job are queued in the stream's order after the
    # previous pass's, and across streams where the caller orders them, as
    # torch asks of any tensor used on two (torch.cuda.graph synchronizes
    # before it captures; the replays then run in their stream's order).
    if p.cuda_index is not None:
        a.stream = _stream_at(p.cuda_index)
    a.count = x.numel() // p.channels
    a.mean, a.invstd = mean.data_ptr(), invstd.data_ptr()
    a.count_out = count.data_ptr()
    # Straight to the C function (its argument types set once, in
    # bnps._native's table): one int, the block's address.
    code = _lib.bnps_device_call_forward(p.call_at, a.err_at, ERR_LEN)
    if code:
        raise _native.error(code, a.err)
    if a.exchanges:
        d["_bnps_step"] = p.step = p.step + 1  # (d's: nn.Module's setattr
    if a.captured:  # its replays advance the steps     costs ~10 us)
        p.captured = True
    y = k.batch_norm_elemt(x, weight, bias, mean, invstd, eps)
    return y, FusedStats(mean, invstd, count, p,
                         d["bnps_name"] if a.backward_exchanges else None)


def backward(bn, x, weight, dy, stats, eps, need_dx):
    """(dx, dweight, dbias) of a FUSED forward's pass: dx None unless
    need_dx, dweight and dbias None without a weight."""
    k = torch if x.is_cuda else CpuKernels
    if not dy.is_contiguous() and not _laid_out(dy):  # (as torch's
        dy = dy.contiguous()                          # SyncBatchNorm does)
    mean, invstd = stats.mean, stats.invstd
    has_weight = weight is not None
    merges = stats.layer is not None
    sum_dy, sum_dy_xmu, dweight, dbias = k.batch_norm_backward_reduce(
        dy, x, mean, invstd, weight, need_dx or merges, has_weight,
        has_weight)
    if merges:
        p = stats.plan
        a = p.call
        if p.cuda_index is not None:  # (autograd: the forward's stream)
            a.stream = _stream_at(p.cuda_index)
        a.invstd = invstd.data_ptr()
        a.sum_dy, a.sum_dy_xmu = sum_dy.data_ptr(), sum_dy_xmu.data_ptr()
        code = _lib.bnps_device_call_backward(p.call_at, a.err_at, ERR_LEN)
        if code:
            raise _native.error(code, a.err)
        stats.sums = (sum_dy, sum_dy_xmu)
        d = bn.__dict__  # (nn.Module's __setattr__ costs ~10 us)
        d["_bnps_backward_step"] += 1
        if p.backward_step == d["_bnps_backward_step"] - 1:
            p.backward_step += 1
    dx = None
    if need_dx:
        dx = k.batch_norm_backward_elemt(dy, x, mean, invstd, weight, sum_dy,
                                         sum_dy_xmu, stats.count)
    return dx, dweight, dbias
