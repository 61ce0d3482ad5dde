"""Stream-ordered exchanges for bnps.torch.SyncBatchNorm: the default on
CUDA (Connection.queues_on; init(stream_exchange=False) or
BNPS_STREAM_EXCHANGE=0 turns it off, =1 turns it on for the CPU too). A
pass takes the fused route (bnps/torch/_device_route.py: one native call
around torch's fused kernels) where it can; this module is the QUEUED
route, for what the fused one does not take (an empty batch, 16-bit
running statistics, odd strides, a CUDA driver without its calls).

Without it a layer on a GPU waits for the device at every exchange: the
layer's statistics are copied to the host, the stream is synchronized, the
exchange runs, and the results go back. The host stops queueing work while
the device drains, and the device idles while the host queues again, once
per layer and pass.

Here, per layer and pass, the host queues on the current stream: the copy
of the statistics into a pinned buffer, the exchange as a CUDA host
function (bnps._native.StreamQueue: the C++ runs it when the stream reaches
it, and holds the stream's later work until it returns), the copy of its
results back, and the kernels that use them. The host never waits for the
device, so it queues a whole step ahead, and the device waits for each
exchange only as long as the exchange takes. The arithmetic is the waiting
path's (the same rules, in C++; the same torch kernels).

What changes for a user: an exchange that fails (a peer that stopped
calling: bnps.DeadlineExceeded) is raised by a later call: the next layer
pass queued, or Connection.drain_exchanges(), which Connection.step(),
finish() and the bnps optimizer call (close() warns). Until then the layers
normalize with their own statistics, and later exchanges are skipped. A
layer's passes must run on one stream (as torch's autograd runs a backward
on its forward's stream). Under torch.compile the custom ops queue the
same way (bnps/torch/custom_ops.py). With =1 on the CPU's native float32
path layers still wait; on the CPU each exchange runs inside the call that
queues it (the tests' path).
"""

import torch

from bnps.torch import _device_route
from bnps.torch import channels as _channels
from bnps.torch.channels import as_dtype

F64 = torch.float64


class QueuedStats:
    """A queued forward's statistics: on the device (the mean, the biased
    variance and 1 / sqrt(var + eps) as rows), and as the C++ outcome its
    backward pass's job reads; with the queue and client it went through,
    which its backward pass takes too."""

    def __init__(self, rows, outcome, layer, queue, native):
        self.rows = rows        # 3 rows of C, the input's accumulation dtype
        self.outcome = outcome  # bnps._native.Outcome
        self.layer = layer      # the layer's name if the backward syncs
        self.queue = queue      # bnps._native.StreamQueue
        self.native = native    # bnps._native.Client


# The dtypes the jobs' buffers hold (bnps_c.h: float32 or float64).
_ITEMSIZE = {torch.float32: 4, torch.float64: 8}


class _Buffers:
    """One layer's host buffers (pinned for CUDA), in the dtypes of the
    device tensors they are copied from or to, so that every copy is a
    plain asynchronous one: `acc` for the statistics, sums and dx's map,
    `running` for the running statistics. Reused every step, since every
    use is ordered on the layer's stream. Also the float64 host copy of
    the running statistics, which the jobs update."""

    def __init__(self, channels, cuda, acc, running):
        # Normal tensors even when the first pass runs under
        # torch.inference_mode: later passes outside it write them.
        with torch.inference_mode(False):
            self._make(channels, cuda, acc, running)

    def _make(self, channels, cuda, acc, running):
        def host(shape, dtype):
            return torch.zeros(shape, dtype=dtype, pin_memory=cuda)
        self.key = (channels, cuda, acc, running)
        self.local = host(2 * channels, acc)     # mean, biased var
        self.rows = host((3, channels), acc)     # mean, var, 1/sqrt(var+eps)
        self.sums = host(3 * channels, acc)      # sum_dy, sum_dy_xhat, weight
        self.k = host((3, channels), acc)        # dx's map
        self.running = host(2 * channels, running)
        # Its halves, as the layer's two buffers read them.
        self.running_halves = (self.running[:channels],
                               self.running[channels:])
        self.tracked_out = host(1, torch.int64)
        self.running_mean = torch.zeros(channels, dtype=F64)
        self.running_var = torch.zeros(channels, dtype=F64)
        self.tracked = torch.zeros(1, dtype=torch.int64)
        self.running_key = None                  # the buffers they copy
        # What the jobs take, (address, item size) or addresses: fixed,
        # as the buffers are.
        self.local_arg, self.rows_arg = _typed(self.local), _typed(self.rows)
        self.sums_arg, self.k_arg = _typed(self.sums), _typed(self.k)
        self.running_args = (self.running_mean.data_ptr(),
                             self.running_var.data_ptr(),
                             self.tracked.data_ptr(), _typed(self.running))
        self.tracked_out_arg = self.tracked_out.data_ptr()
        # Views kept rather than made per pass.
        self.tracked_out_0 = self.tracked_out[0]
        self.sums_two = self.sums[:2 * channels]  # without the weight


def _note_wait(bn, cuda):
    """Counts a wait of the layer for the device (Connection.host_waits)."""
    q = bn._connection()._queues.get(cuda)
    if q is not None:
        _device_route.note_wait(q)


def _buffers(bn, channels, cuda, acc):
    """The layer's _Buffers; the running statistics' buffers in their own
    dtype where the jobs can write it, else in float32 (converted on the
    device)."""
    rm = bn.running_mean
    running = rm.dtype if rm is not None and rm.dtype in _ITEMSIZE \
        else torch.float32
    key = (channels, cuda, acc, running)
    b = bn.__dict__.get("_bnps_queued")
    if b is None or b.key != key:
        if b is not None and b.key[1]:  # queued jobs may still use the old
            _note_wait(bn, True)
            torch.cuda.synchronize()
        b = bn.__dict__["_bnps_queued"] = _Buffers(channels, cuda, acc,
                                                   running)
    return b


def _to_device(host, device):
    """An asynchronous copy on the current stream (a copy of its own on the
    CPU: the buffer is rewritten by the next job)."""
    if device.type != "cuda":
        return host.clone()
    return host.to(device, non_blocking=True)


def _typed(t):
    return t.data_ptr(), _ITEMSIZE[t.dtype]


def _sync_running_copy(bn, b, device):
    """The host copy of the running statistics, read again from the buffers
    when they changed otherwise (first use, load_state_dict, .to()): after
    the stream's queued jobs, which write the copy, have run."""
    key = bn._running_key()
    if b.running_key == key:
        return
    _note_wait(bn, device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    b.tracked[0] = int(bn.num_batches_tracked)
    b.running_mean.copy_(bn.running_mean.detach().to("cpu", F64))
    b.running_var.copy_(bn.running_var.detach().to("cpu", F64))
    b.running_key = key


def _load_running(bn, b, device):
    """The job's running statistics into the layer's buffers, queued."""
    # (The buffers take no gradient: no autograd to keep out.)
    rm, rv = bn.running_mean, bn.running_var
    if device.type == "cuda" and b.running.dtype == rm.dtype:
        mean, var = b.running_halves  # straight from the host
    else:
        # A copy of its own on the CPU; 16-bit buffers converted on the
        # device.
        src = _to_device(b.running, device)
        c = rm.shape[0]
        mean, var = src[:c], src[c:]
    rm.copy_(mean, non_blocking=True)
    rv.copy_(var, non_blocking=True)
    bn.num_batches_tracked.copy_(b.tracked_out_0, non_blocking=True)
    b.running_key = bn._running_key()


def forward(bn, queue, rule, native, x, weight, bias, eps, acc):
    """The training-mode forward of `bn` (SyncBatchNorm) with its exchange
    queued: (y, QueuedStats)."""
    device, channels = x.device, x.shape[1]
    count = x.numel() // channels
    track = bn.running_mean is not None
    bn._check_named(rule, track)
    handle = _device_route.current_stream(device)
    b = _buffers(bn, channels, handle is not None, acc)
    xa = as_dtype(x, acc)
    # Host buffers are written only by copies queued on the stream (or the
    # jobs): an earlier job may not have read them yet.
    if count > 0:
        var, mean = _channels.var_mean(xa, _channels.reduce_dims(x))
        local = torch.cat([mean, var])
    else:  # an empty batch: count 0
        local = torch.zeros(2 * channels, dtype=acc, device=device)
    b.local.copy_(local, non_blocking=True)
    if track:
        _sync_running_copy(bn, b, device)
    running = b.running_args if track else (None,) * 4
    outcome, exchanged, global_backward = queue.forward(
        handle, rule, native, bn.bnps_name or "", bn._bnps_step, count,
        b.local_arg, channels, eps, bn.momentum, running[0], running[1],
        running[2], b.rows_arg, running[3],
        b.tracked_out_arg if track else None)
    bn._bnps_step += int(exchanged)
    rows = _to_device(b.rows, device).unbind(0)
    if track:
        _load_running(bn, b, device)
    y = _channels.normalize(xa, rows[0], rows[1], as_dtype(weight, acc),
                            as_dtype(bias, acc), eps)
    name = bn.bnps_name if global_backward else None
    return as_dtype(y, x.dtype), QueuedStats(rows, outcome, name, queue,
                                             native)


def backward(bn, x, weight, dy, stats, eps, need_dx, acc):
    """forward's backward pass, its exchange and dx's map queued: (dx,
    dweight, dbias) as _layer_ops.backward's."""
    device, channels = x.device, x.shape[1]
    handle = _device_route.current_stream(device)
    b = _buffers(bn, channels, handle is not None, acc)
    xa, dya = as_dtype(x, acc), as_dtype(dy, acc)
    d = stats.rows
    sum_dy, sum_dy_xhat = _channels.backward_sums(
        xa, dya, d[0], d[2], bn._ones(channels, acc, device), eps)
    has_weight = need_dx and weight is not None
    rows = [sum_dy, sum_dy_xhat] + ([as_dtype(weight.detach(), acc)]
                                    if has_weight else [])
    (b.sums if has_weight else b.sums_two).copy_(torch.cat(rows),
                                                 non_blocking=True)
    layer = stats.layer or ""
    want_k = need_dx and x.numel() > 0
    if layer or want_k:
        stats.queue.backward(
            handle, stats.native if layer else None, layer,
            bn._bnps_backward_step, b.sums_arg, has_weight, channels,
            stats.outcome, eps, b.k_arg if want_k else None)
        if layer:
            bn._bnps_backward_step += 1
    dx = None
    if need_dx:
        if not want_k:
            dx = torch.zeros_like(x)
        else:
            k = _to_device(b.k, device)
            dx = _channels.input_gradient(k, xa, dya, x.dtype)
    return (dx,) + _channels.parameter_gradients(weight, sum_dy, sum_dy_xhat)
