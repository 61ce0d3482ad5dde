"""What each route of a bnps.torch.SyncBatchNorm training pass runs
(_routes.py names the routes and chooses one): forward() and backward()
dispatch on the route; the eager autograd Function (sync_batchnorm.py) and
the compiled custom ops (custom_ops.py) both call them, so compiled and
eager passes give the same bits. `bn` is the layer (SyncBatchNorm): its
exchanges and running statistics are its own methods.
"""

import ctypes
import math

import torch

from bnps import _native
from bnps.torch import _routes
from bnps.torch import channels as channels_
from bnps.torch import stream_exchange as _queued
from bnps.torch.staging import Staging


def local_moments(x, staging=None):
    """(count, mean, m2) of `x` (N, C, *) per channel: count an int, mean and
    m2 float64 CPU tensors of size C, of their own. On CUDA one reduction
    (torch.var_mean: the mean and the biased variance), on the CPU two
    passes (the mean, then the squared deviations from it: torch's CPU
    var_mean is several times slower); accumulated in float32 for 16-bit
    inputs; one copy of both to the host (through `staging`'s pinned
    buffer for CUDA input, when given)."""
    channels = x.shape[1]
    count = x.numel() // channels if channels else 0
    if count == 0:
        zeros = torch.zeros(channels, dtype=torch.float64)
        return 0, zeros, zeros.clone()
    xa, dims = x.to(channels_.acc_dtype(x.dtype)), channels_.reduce_dims(x)
    if x.is_cuda:  # one kernel: the mean and the biased variance
        var, mean = channels_.var_mean(xa, dims)
        m2_scale = count
    else:  # two passes (torch's CPU var_mean is several times slower)
        mean = xa.sum(dim=dims) / count
        var = ((xa - mean.view(channels_.channel_shape(x))) ** 2).sum(
            dim=dims)
        m2_scale = 1  # var is the sum of squared deviations itself
    host = (staging or Staging()).to_host(
        "moments", torch.stack([mean, var])).to(torch.float64)
    return count, host[0], host[1] * m2_scale


def np_(t):
    return t.detach().numpy()


def ptr(t):
    return None if t is None else t.data_ptr()


class Stats:
    """What a forward pass normalized with, and how its backward syncs."""

    def __init__(self, count, moments, layer=None, native=False):
        self.count = count      # samples the statistics describe
        self.moments = moments  # float64 CPU, 2 x C: the mean, the biased var
        self.layer = layer      # the layer's name if the backward pass syncs
        self.native = native    # the forward took NATIVE_CPU (x suits it)
        self._on_device = None  # (device, dtype, eps, 3 x C there)

    def on_device(self, device, dtype, eps, staging):
        """The mean, the biased variance and 1 / sqrt(var + eps) (made in
        float64 here) as rows of one `dtype` tensor on `device`: one copy,
        made by the forward pass and kept for its backward (made again
        where the backward gets the statistics alone: torch.compile's
        ops). batch_norm in inference form takes the variance, the
        backward reduction 1/std (1 / invstd^2 - eps would round)."""
        d = self._on_device
        if d is None or d[:3] != (device, dtype, eps):
            rows = torch.stack([self.mean, self.var,
                                torch.rsqrt(self.var + eps)])
            d = self._on_device = (device, dtype, eps, staging.to_device(
                "statistics", rows, device, dtype))
        return d[3]

    @property
    def mean(self):
        return self.moments[0]

    @property
    def var(self):
        return self.moments[1]


def stats_of(count, mean, var, layer=None):
    return Stats(count, torch.stack([mean, var]), layer)


def choose(bn, x, weight, bias, compiling):
    """The route of a pass of `bn` on `x` (_routes.choose on its facts),
    its fallback warned once."""
    s = bn._connection() if bn.training else None
    route, fallback = _routes.choose(
        _routes.facts(bn, x, weight, bias, s, compiling))
    if fallback is not None:
        _routes.warn_once(bn, fallback)
    return route


def forward(bn, x, weight, bias, eps, route=None):
    """A training-mode forward pass of `bn` on `route` (None: chosen here,
    as the compiled op does when it runs): (y, stats), stats a Stats or,
    where the exchange was queued, a stream_exchange.QueuedStats. Its first
    step, eager or compiled: the layer claims its name in the connection
    (Connection.claim_layer_name)."""
    if route is None:
        route = choose(bn, x, weight, bias, compiling=False)
    if bn.bnps_name:
        bn._connection().claim_layer_name(bn)
    return _FORWARD[route](bn, x, weight, bias, eps)


def backward(bn, x, weight, dy, stats, eps, need_dx):
    """(dx, dweight, dbias) of forward's pass: dx None unless need_dx,
    dweight and dbias None without a weight."""
    queued = isinstance(stats, _queued.QueuedStats)
    route = _routes.choose_backward(
        queued, not queued and dy.dtype == torch.float32 and dy.is_cpu and
        (stats.native or _routes.native_shape(x, weight) is not None))
    return _BACKWARD[route](bn, x, weight, dy, stats, eps, need_dx)


def _client_native(bn):
    """The connection's native client (bnps._native.Client): the one path
    of every exchange."""
    return bn._connection().client.native


def _native_forward(bn, x, weight, bias, eps):
    """NATIVE_CPU: the moments, the exchange, the running statistics'
    update and y in one call (bnps._native.layer_forward)."""
    buffers = bn._buffers  # (nn.Module's attributes cost a lookup each)
    rm, rv = buffers.get("running_mean"), buffers.get("running_var")
    n, channels = x.shape[0], x.shape[1]
    s = bn._connection()
    rule = worker_bn(s)
    bn._check_named(rule, rm is not None)  # the servers key the layer by it
    y = torch.empty_like(x)
    moments = torch.empty(2, channels, dtype=torch.float64)
    info = (ctypes.c_int64 * 3)()  # not a tensor: read back without torch
    try:
        _native.layer_forward(
            rule, s.client.native, bn.bnps_name or "", bn._bnps_step,
            x.data_ptr(), n, channels, math.prod(x.shape[2:]), ptr(weight),
            ptr(bias), eps, bn.momentum, ptr(rm), ptr(rv),
            ptr(buffers.get("num_batches_tracked")), torch.get_num_threads(),
            y.data_ptr(), moments.data_ptr(), ctypes.addressof(info))
    finally:
        count, exchanged, global_backward = info
        bn._bnps_step += exchanged
    return y, Stats(count, moments,
                    bn.bnps_name if global_backward else None, native=True)


def _torch_forward(bn, x, weight, bias, eps):
    """WAITING and RECALIBRATING: the statistics from the
    layer's exchange (bn._exchange_forward), normalized by torch's fused
    kernel (batch_norm in inference form)."""
    stats = bn._exchange_forward(x)
    acc = channels_.acc_dtype(x.dtype)
    d = stats.on_device(x.device, acc, eps, bn._staging())
    w = None if weight is None else weight.to(acc)
    b = None if bias is None else bias.to(acc)
    y = channels_.normalize(x.to(acc), d[0], d[1], w, b, eps)
    return y.to(x.dtype), stats


def _queued_forward(bn, x, weight, bias, eps):
    """QUEUED: torch operations with the exchange queued on the stream
    (bnps/torch/stream_exchange.py)."""
    s = bn._connection()
    return _queued.forward(bn, s.exchange_queue(x.device), worker_bn(s),
                           s.client.native, x, weight, bias, eps,
                           channels_.acc_dtype(x.dtype))


def _native_backward(bn, x, weight, dy, stats, eps, need_dx):
    """NATIVE_CPU: the sums, their exchange, dx, dweight and dbias in one
    call (bnps._native.layer_backward)."""
    shape = (x.shape[0], x.shape[1], math.prod(x.shape[2:]))
    native, step = None, 0
    if stats.layer is not None:  # the sums go to the servers
        native, step = _client_native(bn), bn._bnps_backward_step
    dy = dy.contiguous()
    dx = torch.empty_like(x) if need_dx else None
    dweight = dbias = None
    if weight is not None:
        dweight, dbias = torch.empty_like(weight), torch.empty_like(weight)
    _native.layer_backward(
        native, stats.layer or "", step, dy.data_ptr(), x.data_ptr(), *shape,
        ptr(weight), stats.count, stats.moments.data_ptr(), eps,
        torch.get_num_threads(), ptr(dx), ptr(dweight), ptr(dbias))
    if stats.layer is not None:
        bn._bnps_backward_step += 1
    return dx, dweight, dbias


def _torch_backward(bn, x, weight, dy, stats, eps, need_dx):
    """WAITING: torch's fused reduction for the two sums, their exchange
    and dx's map (dx = k1 dy + k2 x + k3 per channel, bn::InputGradient)
    in one native call, and two fused multiply-adds."""
    acc = channels_.acc_dtype(x.dtype)
    channels = x.shape[1]
    f64 = dict(dtype=torch.float64)
    staging = bn._staging()
    xa, dya = x.to(acc), dy.to(acc)
    d = stats.on_device(x.device, acc, eps, staging) if x.numel() > 0 \
        else (None, None, None)
    sum_dy, sum_dy_xhat = channels_.backward_sums(
        xa, dya, d[0], d[2], bn._ones(channels, acc, x.device), eps)
    # The two sums (and the weight, for dx) to the host in one copy.
    rows = [sum_dy.to(**f64), sum_dy_xhat.to(**f64)]
    if need_dx and weight is not None:
        rows.append(weight.detach().to(**f64))
    host = staging.to_host("sums", torch.stack(rows))
    l_dy, l_dy_xhat = host[0], host[1]
    layer = stats.layer or ""
    native = _client_native(bn) if layer else None
    k = None
    if need_dx and x.numel() > 0:
        k = torch.empty(3, channels, dtype=torch.float64)
    if layer or k is not None:
        moments = stats.moments.contiguous()  # kept until the call returns
        _native.layer_exchange_backward(
            native, layer, bn._bnps_backward_step, l_dy.data_ptr(),
            l_dy_xhat.data_ptr(), channels, stats.count, moments.data_ptr(),
            host[2].data_ptr() if len(rows) > 2 else None, eps, ptr(k))
        if layer:
            bn._bnps_backward_step += 1
    dx = None
    if need_dx:
        if k is None:
            dx = torch.zeros_like(x)
        else:
            k = staging.to_device("dx", k, x.device, acc)
            dx = channels_.input_gradient(k, xa, dya, x.dtype)
    return (dx,) + channels_.parameter_gradients(weight, sum_dy, sum_dy_xhat)


def _queued_backward(bn, x, weight, dy, stats, eps, need_dx):
    """QUEUED: the forward's queue takes the backward exchange too."""
    return _queued.backward(bn, x, weight, dy, stats, eps, need_dx,
                            channels_.acc_dtype(x.dtype))


_FORWARD = {
    _routes.NATIVE_CPU: _native_forward,
    _routes.QUEUED: _queued_forward,
    _routes.WAITING: _torch_forward,
    _routes.RECALIBRATING: _torch_forward,
}
_BACKWARD = {
    _routes.NATIVE_CPU: _native_backward,
    _routes.QUEUED: _queued_backward,
    _routes.WAITING: _torch_backward,
}


def worker_bn(connection):
    """The connection's policy rules (bnps._native.WorkerBn), made once."""
    rule = getattr(connection, "_bnps_worker_bn", None)
    if rule is None:
        rule = _native.WorkerBn(connection.config["policy"],
                                connection.config.get("bn_momentum", 0.1))
        connection._bnps_worker_bn = rule
    return rule
