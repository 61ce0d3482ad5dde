"""Stream-ordered exchanges for bnps.torch.SyncBatchNorm (opt-in:
init(stream_exchange=True) or BNPS_STREAM_EXCHANGE=1).

On a GPU the default path waits for the device at every exchange: the
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
exchange only as long as the exchange takes. The arithmetic is the default
path's (the same rules, in C++; the same torch kernels).

What changes for a user: an exchange that fails (a peer that stopped
calling: bnps.DeadlineExceeded) is raised by a later call: the next layer
pass queued, or Connection.drain_exchanges(), which Connection.step(),
finish() and the bnps optimizer call (close() warns). Until then the layers
normalize with their own statistics, and later exchanges are skipped. A
layer's passes must run on one stream (as torch's autograd runs a backward
on its forward's stream). Eager mode only: under torch.compile, and on the
CPU's native float32 path, layers exchange as by default. On the CPU each
exchange runs inside the call that queues it (the tests' path).
"""

import torch
from torch.nn import functional as F

from bnps.torch import channels as _channels

F64 = torch.float64


class QueuedStats:
    """A queued forward's statistics: on the device (the mean, the biased
    variance and 1 / sqrt(var + eps) as rows), and as the C++ outcome its
    backward pass's job reads."""

    def __init__(self, rows, outcome, layer):
        self.rows = rows        # 3 x C, the input's accumulation dtype
        self.outcome = outcome  # bnps._native.Outcome
        self.layer = layer      # the layer's name if the backward syncs


class _Buffers:
    """One layer's host buffers (pinned for CUDA): reused every step, since
    every use is ordered on the layer's stream; the host copy of its running
    statistics, which its jobs update."""

    def __init__(self, channels, cuda):
        def host(n, dtype=F64):
            return torch.zeros(n, dtype=dtype, pin_memory=cuda)
        self.channels = channels
        self.local = host(2 * channels)         # mean, biased var
        self.out = host(4 * channels + 1)       # stats, running, tracked
        self.sums = host(3 * channels)          # sum_dy, sum_dy_xhat, weight
        self.k = host(3 * channels)             # dx's map
        self.running_mean = torch.zeros(channels, dtype=F64)
        self.running_var = torch.zeros(channels, dtype=F64)
        self.tracked = torch.zeros(1, dtype=torch.int64)
        self.running_key = None                 # the buffers they copy


def _buffers(bn, channels, cuda):
    b = bn.__dict__.get("_bnps_queued")
    if b is None or b.channels != channels or b.local.is_pinned() != cuda:
        b = bn.__dict__["_bnps_queued"] = _Buffers(channels, cuda)
    return b


def _stream(device):
    """(stream to sync or None, its handle for the C ABI)."""
    if device.type != "cuda":
        return None, None
    s = torch.cuda.current_stream(device)
    return s, s.cuda_stream


def _to_device(host, device):
    """An asynchronous copy on the current stream (a copy of its own on the
    CPU: the buffer is rewritten by the next job)."""
    if device.type != "cuda":
        return host.clone()
    return host.to(device, non_blocking=True)


def _sync_running_copy(bn, b, stream):
    """The host copy of the running statistics, read again from the buffers
    when they changed otherwise (first use, load_state_dict, .to()): after
    the stream's queued jobs, which write the copy, have run."""
    key = bn._running_key()
    if b.running_key == key:
        return
    if stream is not None:
        stream.synchronize()
    b.tracked[0] = int(bn.num_batches_tracked)
    b.running_mean.copy_(bn.running_mean.detach().to("cpu", F64))
    b.running_var.copy_(bn.running_var.detach().to("cpu", F64))
    b.running_key = key


def _ptr(t):
    return None if t is None else t.data_ptr()


def forward(bn, queue, rule, native, x, weight, bias, eps, acc):
    """The training-mode forward of `bn` (SyncBatchNorm) with its exchange
    queued: (y, QueuedStats)."""
    device, channels = x.device, x.shape[1]
    count = x.numel() // channels
    track = bn.running_mean is not None
    if not bn.bnps_name and rule.plan_forward(track)[0]:
        bn._name()  # raises: the servers key the layer by its name
    stream, handle = _stream(device)
    b = _buffers(bn, channels, stream is not None)
    xa = x.to(acc)
    if count > 0:
        var, mean = _channels.var_mean(xa, _channels.reduce_dims(x))
        local = torch.cat([mean, var]).to(F64)
    else:
        local = torch.zeros(2 * channels, dtype=F64, device=device)
    b.local.copy_(local, non_blocking=True)
    if track:
        _sync_running_copy(bn, b, stream)
    outcome, exchanged, global_backward = queue.forward(
        handle, rule, native, bn.bnps_name or "", bn._bnps_step, count,
        b.local.data_ptr(), channels, bn.momentum,
        _ptr(b.running_mean) if track else None,
        _ptr(b.running_var) if track else None,
        _ptr(b.tracked) if track else None, b.out.data_ptr())
    bn._bnps_step += int(exchanged)
    out = _to_device(b.out, device)
    mean, var = out[:channels], out[channels:2 * channels]
    rows = torch.stack([mean, var, torch.rsqrt(var + eps)]).to(acc)
    if track:
        with torch.no_grad():
            bn.running_mean.copy_(out[2 * channels:3 * channels])
            bn.running_var.copy_(out[3 * channels:4 * channels])
            bn.num_batches_tracked.copy_(out[4 * channels])
        b.running_key = bn._running_key()
    w = None if weight is None else weight.to(acc)
    bi = None if bias is None else bias.to(acc)
    y = F.batch_norm(xa, rows[0], rows[1], w, bi, False, 0.0, eps)
    name = bn.bnps_name if global_backward else None
    return y.to(x.dtype), QueuedStats(rows, outcome, name)


def backward(bn, queue, native, x, weight, dy, stats, eps, need_dx, acc):
    """forward's backward pass, its exchange and dx's map queued: (dx,
    dweight, dbias) as sync_batchnorm._backward's."""
    device, channels = x.device, x.shape[1]
    stream, handle = _stream(device)
    b = _buffers(bn, channels, stream is not None)
    xa, dya = x.to(acc), dy.to(acc)
    if x.numel() > 0:
        d = stats.rows
        _, sum_dy_xhat, sum_dy = torch.ops.aten.native_batch_norm_backward(
            dya, xa, bn._ones(channels, acc, device), None, None, d[0], d[2],
            True, eps, [False, True, True])
    else:
        sum_dy = torch.zeros(channels, dtype=acc, device=device)
        sum_dy_xhat = torch.zeros_like(sum_dy)
    has_weight = need_dx and weight is not None
    rows = [sum_dy, sum_dy_xhat] + ([weight.detach()] if has_weight else [])
    n = len(rows) * channels
    b.sums[:n].copy_(torch.cat([r.to(F64) for r in rows]), non_blocking=True)
    layer = stats.layer or ""
    want_k = need_dx and x.numel() > 0
    if layer or want_k:
        queue.backward(handle, native if layer else None, layer,
                       bn._bnps_backward_step, b.sums.data_ptr(), has_weight,
                       channels, stats.outcome, eps,
                       b.k.data_ptr() if want_k else None)
        if layer:
            bn._bnps_backward_step += 1
    dx = None
    if need_dx:
        if not want_k:
            dx = torch.zeros_like(x)
        else:
            shape = _channels.channel_shape(x)
            k = _to_device(b.k, device).to(acc).view(3, channels)
            dx = torch.addcmul(k[2].view(shape), xa, k[1].view(shape))
            dx.addcmul_(dya, k[0].view(shape))
            dx = dx.to(x.dtype)
    dweight = dbias = None
    if weight is not None:
        dweight = sum_dy_xhat.to(weight.dtype)
        dbias = sum_dy.to(weight.dtype)
    return dx, dweight, dbias
