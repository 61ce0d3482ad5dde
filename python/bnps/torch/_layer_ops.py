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
from bnps.torch import _device_route
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

    __slots__ = ("count", "_moments", "layer", "native", "_on_device")

    def __init__(self, count, moments, layer=None, native=False):
        self.count = count      # samples the statistics describe
        # float64 CPU, 2 x C: the mean, the biased var; a tensor, or the
        # native forward's ctypes array (made a tensor where asked for)
        self._moments = moments
        self.layer = layer      # the layer's name if the backward pass syncs
        self.native = native    # the forward took NATIVE_CPU (x suits it)
        self._on_device = None  # (device, dtype, eps, 3 x C there)

    @property
    def moments(self):
        m = self._moments
        if not isinstance(m, torch.Tensor):
            m = self._moments = torch.frombuffer(
                m, dtype=torch.float64).view(2, len(m) // 2)
        return m

    def moments_at(self):
        """The address of the moments, float64 in (2, C) order."""
        m = self._moments
        if not isinstance(m, torch.Tensor):
            return ctypes.addressof(m)
        if not m.is_contiguous():
            m = self._moments = m.contiguous()
        return m.data_ptr()

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
    its fallback warned once. A training pass on NATIVE_CPU keeps its
    NativePlan, and later passes take that route at once while the plan
    holds for them (NativePlan.holds: the layer's state is the same and x
    suits the native call); so does FUSED with its DevicePlan
    (_device_route.holds)."""
    training = bn.training
    if training and not compiling:
        s = bn.connection
        if s is None:
            s = bn._connection()
        plan = bn.__dict__.get("_bnps_plan")
        if plan is not None and plan.holds(bn, x, weight, bias, s):
            return _routes.NATIVE_CPU
        if "_bnps_device_plan" in bn.__dict__ and \
                _device_route.holds(bn, x, s):
            return _routes.FUSED
    else:
        s = None
    route, fallback = _routes.choose(
        _routes.facts(bn, x, weight, bias, s, compiling))
    if fallback is not None:
        _routes.warn_once(bn, fallback)
    if route == _routes.NATIVE_CPU and not compiling:
        bn.__dict__["_bnps_plan"] = NativePlan(bn, weight, bias, s)
    return route


class NativePlan:
    """What a layer's NATIVE_CPU passes share, made once for its
    configuration (its connection, name, parameters and buffers: their
    addresses, with the tensors kept so that no other tensor can take
    them): the policy's rules, the client, and the LayerPass blocks of the
    two native calls with those written in. A layer makes one where
    _routes.choose gives NATIVE_CPU and keeps it while holds() (its name
    claimed in the connection and checked against the policy then). The
    blocks are the layer's: one pass of it at a time, as its step counters
    already require."""

    __slots__ = ("owner", "key", "keep", "forward", "backward",
                 "forward_at", "backward_at")

    def __init__(self, bn, weight, bias, connection):
        buffers = bn._buffers
        rm, rv = buffers.get("running_mean"), buffers.get("running_var")
        tracked = buffers.get("num_batches_tracked")
        rule = worker_bn(connection)
        bn._check_named(rule, rm is not None)  # the servers key layers by it
        if bn.bnps_name:
            connection.claim_layer_name(bn)
        native = connection.client.native
        name = (bn.bnps_name or "").encode()
        self.owner = bn
        self.key = _state_key(bn, weight, bias, connection)
        # The tensors (their storage) and handles the blocks point into.
        tensors = tuple(None if t is None else t.detach()
                        for t in (weight, bias, rm, rv, tracked))
        self.keep = (rule, native, name, tensors)
        f = self.forward = _native.LayerPass()
        f.set_rule(rule, native)
        f.layer = name
        f.weight, f.bias, f.running_mean, f.running_var, \
            f.batches_tracked = (ptr(t) for t in tensors)
        b = self.backward = _native.LayerPass()
        b.weight = f.weight
        self.forward_at = ctypes.addressof(f)
        self.backward_at = ctypes.addressof(b)

    def holds(self, bn, x, weight, bias, connection):
        """Whether a training pass of `bn` on `x` takes NATIVE_CPU with
        this plan: the same layer (not a replica sharing its __dict__) in
        the same state, and x float32 on the CPU, contiguous in (N, C, *)
        order, with non-empty samples (as _routes.facts decides)."""
        return (self.owner is bn and x.dtype == torch.float32 and x.is_cpu
                and x.is_contiguous() and math.prod(x.shape[2:]) > 0 and
                self.key == _state_key(bn, weight, bias, connection))


def _state_key(bn, weight, bias, connection):
    """What of the layer's state its NATIVE_CPU route depends on: the
    connection, whether it queues (stream_exchange), recalibration, the
    name, and the addresses of the parameters and buffers (a new dtype,
    device or layout makes new tensors; NativePlan keeps the old ones, so
    no new one can have an old address)."""
    buffers = bn._buffers
    rm, rv = buffers.get("running_mean"), buffers.get("running_var")
    tracked = buffers.get("num_batches_tracked")
    # (ptr() written out: this runs per pass.)
    return (connection, connection.stream_exchange, bn._recal_batch,
            bn.bnps_name,
            None if weight is None else (weight.dtype, weight.data_ptr()),
            None if bias is None else bias.data_ptr(),
            None if rm is None else rm.data_ptr(),
            None if rv is None else rv.data_ptr(),
            None if tracked is None else tracked.data_ptr())


def forward(bn, x, weight, bias, eps, route=None):
    """A training-mode forward pass of `bn` on `route` (None: chosen here,
    as the compiled op does when it runs): (y, stats), stats a Stats or,
    where the exchange was queued, a stream_exchange.QueuedStats. Its first
    step, eager or compiled: the layer claims its name in the connection
    (Connection.claim_layer_name)."""
    if route is None:
        route = choose(bn, x, weight, bias, compiling=False)
    if route != _routes.FUSED:  # (whose plan claimed the name)
        if bn.bnps_name and route != _routes.NATIVE_CPU:  # (so did its)
            bn._connection().claim_layer_name(bn)
        if "_bnps_device_plan" in bn.__dict__:
            _device_route.leave(bn)  # the steps of a graph's replays
    return _FORWARD[route](bn, x, weight, bias, eps)


def backward(bn, x, weight, dy, stats, eps, need_dx):
    """(dx, dweight, dbias) of forward's pass: dx None unless need_dx,
    dweight and dbias None without a weight."""
    if stats.__class__ is Stats and stats.native and dy.is_cpu and \
            dy.dtype == torch.float32:  # the common case at once
        return _BACKWARD[_routes.NATIVE_CPU](bn, x, weight, dy, stats, eps,
                                             need_dx)
    if stats.__class__ is _device_route.FusedStats:
        return _BACKWARD[_routes.FUSED](bn, x, weight, dy, stats, eps,
                                        need_dx)
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
    update and y in one call (bnps._native.layer_pass_forward, on the
    layer's NativePlan, which choose() made or checked for this pass)."""
    d = bn.__dict__  # (nn.Module's attributes cost a lookup each)
    plan = d.get("_bnps_plan")
    if plan is None or plan.owner is not bn:
        plan = d["_bnps_plan"] = NativePlan(bn, weight, bias,
                                            bn._connection())
    shape = x.shape
    channels = shape[1]
    y = torch.empty_like(x)
    # Not a tensor: no torch call (Stats makes a tensor of it if asked).
    moments = (ctypes.c_double * (2 * channels))()
    f = plan.forward
    f.step = d["_bnps_step"]
    f.x = x.data_ptr()
    f.n, f.channels, f.spatial = shape[0], channels, math.prod(shape[2:])
    f.eps = eps
    momentum = bn.momentum
    f.has_momentum = momentum is not None
    f.momentum = 0.0 if momentum is None else momentum
    f.num_threads = torch.get_num_threads()
    f.y = y.data_ptr()
    f.stats = ctypes.addressof(moments)
    try:
        _native.layer_pass_forward(plan.forward_at)
    finally:
        count, exchanged, global_backward = f.info
        d["_bnps_step"] += exchanged
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
    call (bnps._native.layer_pass_backward, on the layer's NativePlan where
    it holds the forward's parameters, else on a block of its own)."""
    d = bn.__dict__
    plan = d.get("_bnps_plan")
    weight_at = None if weight is None else weight.data_ptr()
    if plan is not None and plan.owner is bn and \
            plan.backward.weight == weight_at:
        b, at = plan.backward, plan.backward_at
    else:  # (a backward after the layer changed: a block of its own)
        b = _native.LayerPass()
        b.weight, at = weight_at, ctypes.addressof(b)
    layer = stats.layer
    if layer is not None:  # the sums go to the servers
        native = _client_native(bn)
        b.client = native._h.value
        b.layer = layer.encode()
        b.step = d["_bnps_backward_step"]
    else:
        native = None
        b.client, b.layer, b.step = None, None, 0
    if not dy.is_contiguous():
        dy = dy.contiguous()
    shape = x.shape
    b.dy, b.x = dy.data_ptr(), x.data_ptr()
    dx = dweight = dbias = None
    b.dx = b.dweight = b.dbias = None
    if need_dx:
        dx = torch.empty_like(x)
        b.dx = dx.data_ptr()
    if weight is not None:
        dweight, dbias = torch.empty_like(weight), torch.empty_like(weight)
        b.dweight, b.dbias = dweight.data_ptr(), dbias.data_ptr()
    b.n, b.channels, b.spatial = shape[0], shape[1], math.prod(shape[2:])
    b.count = stats.count
    b.stats = stats.moments_at()
    b.eps = eps
    b.num_threads = torch.get_num_threads()
    try:
        _native.layer_pass_backward(at)
    finally:
        b.client = None  # (the block keeps no handle past the call)
    if layer is not None:
        d["_bnps_backward_step"] += 1
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


def _fused_forward(bn, x, weight, bias, eps):
    """FUSED: torch's fused kernels around one native call
    (bnps/torch/_device_route.py); QUEUED where the driver lacks its
    calls."""
    return _device_route.forward(bn, x, weight, bias, eps, worker_bn,
                                 _queued_forward)


def _queued_backward(bn, x, weight, dy, stats, eps, need_dx):
    """QUEUED: the forward's queue takes the backward exchange too."""
    return _queued.backward(bn, x, weight, dy, stats, eps, need_dx,
                            channels_.acc_dtype(x.dtype))


_FORWARD = {
    _routes.NATIVE_CPU: _native_forward,
    _routes.FUSED: _fused_forward,
    _routes.QUEUED: _queued_forward,
    _routes.WAITING: _torch_forward,
    _routes.RECALIBRATING: _torch_forward,
}
_BACKWARD = {
    _routes.NATIVE_CPU: _native_backward,
    _routes.FUSED: _device_route.backward,
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
