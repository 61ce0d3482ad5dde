"""bnps.torch.SyncBatchNorm: batch normalization whose statistics are merged
across the workers of a bnps job by its shard servers.

In training mode a layer computes its input's per-channel moments (count,
mean, M2), sends them in float64 through the client, and normalizes with
what the servers' policy gives back. Contiguous float32 input on the CPU
takes one native call per pass (bnps._native.layer_forward and
layer_backward: the C++ worker's CPU kernels around the exchange); other
input runs torch operations on its own device (accumulating in float32
for float16/bfloat16 input, in the input's precision otherwise).

    sync    the global batch's moments (a barrier of every worker, per layer
            and step); the backward pass merges sum(dy) and sum(dy * x_hat)
            the same way, so input gradients are those of BN over the global
            batch. Running statistics: updated with the global moments and
            the layer's momentum, as torch does, so they are the same on
            every worker (and equal to the servers' own when the layer
            started fresh with the job's bn_momentum).
    async   merge(own moments, the other workers' latest admissible ones),
            without waiting; the backward pass stays local (the others'
            moments are constants). Running statistics: the servers' (which
            merge every worker's moments), copied into the buffers each step;
            the layer's momentum must be the job's bn_momentum.
    local   its own moments; nothing is sent. Running statistics: its own;
    recal   bnps.torch.sync_running_stats (local) or recalibrate (recal)
            settle them across workers after training.

Eval mode never talks to the servers: it normalizes with the running
statistics in the buffers (or, with track_running_stats=False, with the
input's own statistics, as torch does). Weight and bias gradients are this
worker's own (as torch.nn.SyncBatchNorm's); sum or average them across
workers as for any parameter.

Layers are matched across processes by name: `name=` given here, or assigned
by convert_sync_batchnorm / name_layers (the qualified module name). Each
layer counts its training-mode calls, and separately its backward passes (in
the order autograd runs them); the counts are the steps of its BN calls, so
every worker must call it equally often. A worker whose peers stop calling
gets bnps.DeadlineExceeded naming them after the servers' barrier timeout.
"""

import torch
from torch import nn
from torch.autograd.function import once_differentiable
from torch.nn import functional as F

from bnps import _native
from bnps.torch import channels as channels_
from bnps.torch import custom_ops as _ops
from bnps.torch import groups as _groups
from bnps.torch import connection as _connection
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


def _np(t):
    return t.detach().numpy()


class _Stats:
    """What a forward pass normalized with, and how its backward syncs."""

    def __init__(self, count, moments, layer=None):
        self.count = count      # samples the statistics describe
        self.moments = moments  # float64 CPU, 2 x C: the mean, the biased var
        self.layer = layer      # the layer's name if the backward pass syncs
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


def _stats(count, mean, var, layer=None):
    return _Stats(count, torch.stack([mean, var]), layer)


def _native_shape(x, *others):
    """(n, channels, spatial) of x where the native layer steps
    (bnps._native.layer_forward, layer_backward) take it: float32 CPU x in
    contiguous (N, C, *) order, with float32 CPU contiguous `others` (each
    may be None); else None."""
    for t in (x,) + others:
        if t is not None and (t.dtype != torch.float32 or
                              t.device.type != "cpu" or
                              not t.is_contiguous()):
            return None
    spatial = 1
    for d in x.shape[2:]:
        spatial *= d
    return (x.shape[0], x.shape[1], spatial) if spatial > 0 else None


def _ptr(t):
    return None if t is None else t.data_ptr()


def _refuse_capture(x):
    """RuntimeError while the current CUDA stream captures a graph
    (torch.cuda.graph, make_graphed_callables): a training-mode pass
    exchanges with the servers, which a graph would replay without them
    (the stream-ordered exchange would even be captured, its step
    numbers and all), or fail inside with CUDA's own error."""
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "bnps SyncBatchNorm: a training-mode pass cannot be captured "
            "in a CUDA graph: its exchange with the servers must run every "
            "step. Capture the model in eval mode, or keep the bnps layers "
            "out of the graph")


def _forward(bn, x, weight, bias, eps):
    """y = (x - mean) / sqrt(var + eps) * weight + bias with the statistics
    the layer's exchange gives; returns (y, stats). Float32 CPU input takes
    the native step (the C++ worker's kernels and the exchange in one
    call); other input torch's fused kernel (batch_norm in inference form).
    Shared by the autograd Function (eager) and the custom op
    (torch.compile: bnps/torch/custom_ops.py): the same bits."""
    _refuse_capture(x)
    out = bn._native_forward(x, weight, bias, eps)
    if out is not None:
        return out
    stats = bn._exchange_forward(x)
    acc = channels_.acc_dtype(x.dtype)
    d = stats.on_device(x.device, acc, eps, bn._staging())
    w = None if weight is None else weight.to(acc)
    b = None if bias is None else bias.to(acc)
    y = channels_.normalize(x.to(acc), d[0], d[1], w, b, eps)
    return y.to(x.dtype), stats


def _backward(bn, x, weight, dy, stats, eps, need_dx):
    """(dx, dweight, dbias) of _forward: dx with the sums the layer's
    backward exchange gives (bn/kernels.h explains the variants); dx None
    unless need_dx, dweight and dbias None without a weight. Float32 CPU
    input takes the native step (the kernels and the exchange in one
    call); other input torch's fused reduction for the two sums and two
    fused multiply-adds."""
    _refuse_capture(x)
    out = _native_backward(bn, x, weight, dy, stats, eps, need_dx)
    if out is not None:
        return out
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
    # The exchange (sync) and dx's map (dx = k1 dy + k2 x + k3 per channel,
    # bn::InputGradient) in one native call; a stand-in client (tests)
    # answers the exchange itself first.
    layer = stats.layer or ""
    client = bn._connection().client if layer else None
    native = getattr(client, "native", None)
    if layer and native is None:
        g_dy, g_dy_xhat = bn._exchange_backward(stats, _np(l_dy),
                                                _np(l_dy_xhat))
        l_dy, l_dy_xhat = torch.from_numpy(g_dy), torch.from_numpy(g_dy_xhat)
        layer = ""
    k = None
    if need_dx and x.numel() > 0:
        k = torch.empty(3, channels, dtype=torch.float64)
    if layer or k is not None:
        moments = stats.moments.contiguous()  # kept until the call returns
        _native.layer_exchange_backward(
            native, layer, bn._bnps_backward_step, l_dy.data_ptr(),
            l_dy_xhat.data_ptr(), channels, stats.count, moments.data_ptr(),
            host[2].data_ptr() if len(rows) > 2 else None, eps, _ptr(k))
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


def _native_backward(bn, x, weight, dy, stats, eps, need_dx):
    """_backward's native step, or None where it does not apply."""
    shape = _native_shape(x, weight)
    if shape is None or dy.dtype != torch.float32 or dy.device.type != "cpu":
        return None
    native, step = None, 0
    if stats.layer is not None:  # the sums go to the servers
        native = getattr(bn._connection().client, "native", None)
        if native is None:  # a stand-in client
            return None
        step = bn._bnps_backward_step
    dy = dy.contiguous()
    dx = torch.empty_like(x) if need_dx else None
    dweight = dbias = None
    if weight is not None:
        dweight, dbias = torch.empty_like(weight), torch.empty_like(weight)
    _native.layer_backward(
        native, stats.layer or "", step, dy.data_ptr(), x.data_ptr(), *shape,
        _ptr(weight), stats.count, stats.moments.data_ptr(), eps,
        torch.get_num_threads(), _ptr(dx), _ptr(dweight), _ptr(dbias))
    if stats.layer is not None:
        bn._bnps_backward_step += 1
    return dx, dweight, dbias


def _queued_forward(bn, x, weight, bias, eps):
    """(y, stream_exchange.QueuedStats) where the layer's exchange is queued
    on the stream (SyncBatchNorm._queued_exchange), else None. The first
    step of every training-mode forward pass, eager or compiled: the layer
    claims its name in the connection (Connection.claim_layer_name)."""
    if bn.bnps_name:
        bn._connection().claim_layer_name(bn)
    queued = bn._queued_exchange(x, weight, bias)
    if queued is None:
        return None
    _refuse_capture(x)
    return _queued.forward(bn, *queued, x, weight, bias, eps,
                           channels_.acc_dtype(x.dtype))


def _queued_backward(bn, x, weight, dy, stats, eps, need_dx):
    """_queued_forward's backward pass: (dx, dweight, dbias) as _backward's."""
    _refuse_capture(x)
    return _queued.backward(bn, x, weight, dy, stats, eps, need_dx,
                            channels_.acc_dtype(x.dtype))


class _SyncBatchNormFunction(torch.autograd.Function):
    """The layer's training-mode forward and backward in eager mode (and on
    torch < 2.4 always): _forward and _backward, or their queued forms
    (bnps/torch/stream_exchange.py)."""

    @staticmethod
    def forward(ctx, x, weight, bias, bn, eps):
        out = _queued_forward(bn, x, weight, bias, eps)
        y, stats = out if out is not None else \
            _forward(bn, x, weight, bias, eps)
        ctx.save_for_backward(x, weight)
        ctx.stats = stats
        ctx.bn = bn
        ctx.eps = eps
        return y

    @staticmethod
    @once_differentiable  # the exchanged statistics are constants here: a
    def backward(ctx, dy):  # second derivative would be silently wrong
        x, weight = ctx.saved_tensors
        bn, stats = ctx.bn, ctx.stats
        if isinstance(stats, _queued.QueuedStats):
            dx, dweight, dbias = _queued_backward(
                bn, x, weight, dy, stats, ctx.eps, ctx.needs_input_grad[0])
        else:
            dx, dweight, dbias = _backward(bn, x, weight, dy, stats, ctx.eps,
                                           ctx.needs_input_grad[0])
        return dx, dweight, dbias, None, None


class SyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """torch.nn.SyncBatchNorm's arguments, plus `name` (the layer's key on
    the servers; convert_sync_batchnorm assigns it) and `connection` (default:
    the default connection). `process_group` (torch's, default None: the
    whole job) must be a block of K consecutive ranks (torch rank = bnps
    worker id) with the servers running --bn_group_size=K (bnps/torch/
    groups.py says so at the first training step otherwise). Input: (N, C)
    to (N, C, D, H, W), any memory format, float16/bfloat16/float32/
    float64, CPU or CUDA."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_group=None, device=None,
                 dtype=None, name=None, connection=None):
        super().__init__(num_features, eps, momentum, affine,
                         track_running_stats, device=device, dtype=dtype)
        self.bnps_name = name
        self.connection = connection
        self.process_group = process_group
        self._bnps_group_checked = False
        self._bnps_step = 0       # training-mode calls synced so far
        self._bnps_backward_step = 0  # backward passes synced so far
        self._recal_batch = None  # not None: the next recalibration batch
        self._recal_key = None    # the servers' key of this recalibration
        self._bnps_rounds = {}    # settling rounds so far (convert.py)
        self._bnps_op_id = _ops.register(self)  # for torch.compile

    # Per-process caches (pinned buffers, CUDA events, the host copy of the
    # running statistics), made again when needed: never copied or pickled.
    _CACHES = ("_bnps_staging", "_bnps_ones", "_bnps_running",
               "_bnps_queued")

    def __getstate__(self):
        state = dict(self.__dict__)
        for key in self._CACHES:
            state.pop(key, None)
        return state

    def __setstate__(self, state):
        # A copy (copy.deepcopy, pickle) is a layer of its own for the
        # compiled ops.
        super().__setstate__(state)
        self._bnps_op_id = _ops.register(self)

    def _check_input_dim(self, x):
        if x.dim() < 2 or x.dim() > 5:
            raise ValueError(f"bnps SyncBatchNorm: expected 2-D to 5-D input "
                             f"(N, C, ...), got {x.dim()}-D")
        if x.shape[1] != self.num_features:
            raise ValueError(f"bnps SyncBatchNorm: expected {self.num_features}"
                             f" channels, got input of shape {tuple(x.shape)}")

    def _connection(self):
        return self.connection if self.connection is not None else \
            _connection.default_connection()

    def _name(self):
        if not self.bnps_name:
            raise RuntimeError(
                "bnps SyncBatchNorm has no name: pass name= or call "
                "bnps.torch.convert_sync_batchnorm(model) (or "
                "bnps.torch.name_layers(model)) so that every process keys "
                "its layers alike")
        return self.bnps_name

    def _check_named(self, rule, tracks_running):
        """Raises (as _name) where the policy exchanges and the layer has
        no name: the servers key layers by it."""
        if not self.bnps_name and rule.plan_forward(tracks_running)[0]:
            self._name()

    def extra_repr(self):
        return super().extra_repr() + f", name={self.bnps_name!r}"

    def forward(self, x):
        self._check_input_dim(x)
        if not self.training and self.running_mean is not None:
            return self._eval_forward(x)
        if not self._bnps_group_checked and not _ops.compiling():
            _groups.check_process_group(self.process_group,
                                        self._connection())
            self._bnps_group_checked = True
        if _ops.compiling():  # torch >= 2.4 under torch.compile
            return _ops.batch_norm(x, self.weight, self.bias,
                                       self._bnps_op_id, self.eps)[0]
        return _SyncBatchNormFunction.apply(x, self.weight, self.bias, self,
                                            self.eps)

    def _eval_forward(self, x):
        acc = channels_.acc_dtype(x.dtype)
        y = F.batch_norm(
            x.to(acc), self.running_mean.to(acc), self.running_var.to(acc),
            None if self.weight is None else self.weight.to(acc),
            None if self.bias is None else self.bias.to(acc), False, 0.0,
            self.eps)
        return y.to(x.dtype)

    # --- the exchanges, called by _SyncBatchNormFunction ---

    def _native_forward(self, x, weight, bias, eps):
        """_forward's native step: (y, stats), or None where it does not
        apply (not float32 CPU input and state, recalibrating, eval
        without running statistics, a stand-in client that must answer)."""
        if not self.training or self._recal_batch is not None:
            return None
        rm, rv = self.running_mean, self.running_var
        shape = _native_shape(x, weight, bias, rm, rv)
        if shape is None or (rm is not None and
                             self.num_batches_tracked is None):
            return None
        s = self._connection()
        rule = worker_bn(s)
        native = getattr(s.client, "native", None)
        if rule.plan_forward(rm is not None)[0]:
            if native is None:  # a stand-in client
                return None
            self._name()  # the servers key the layer by it
        y = torch.empty_like(x)
        moments = torch.empty(2, shape[1], dtype=torch.float64)
        info = torch.zeros(3, dtype=torch.int64)
        try:
            _native.layer_forward(
                rule, native, self.bnps_name or "", self._bnps_step,
                x.data_ptr(), *shape, _ptr(weight), _ptr(bias), eps,
                self.momentum, _ptr(rm), _ptr(rv),
                _ptr(self.num_batches_tracked), torch.get_num_threads(),
                y.data_ptr(), moments.data_ptr(), info.data_ptr())
        finally:
            count, exchanged, global_backward = info.tolist()
            self._bnps_step += exchanged
        return y, _Stats(count, moments,
                         self.bnps_name if global_backward else None)

    def _queued_exchange(self, x, weight, bias):
        """(queue, rule, native client) where this forward's exchange is
        queued on the stream (bnps/torch/stream_exchange.py: the
        connection queues on the input's device, training mode, a real
        client, input the native CPU step does not take); else None. Its
        backward pass follows it (stream_exchange.QueuedStats)."""
        s = self._connection()
        if not self.training or not s.queues_on(x.device) or \
                self._recal_batch is not None or \
                _native_shape(x, weight, bias, self.running_mean,
                              self.running_var) is not None:
            return None
        native = getattr(s.client, "native", None)
        if native is None:  # a stand-in client answers through its methods
            return None
        queue = s.exchange_queue(x.device)
        if queue is None:  # no CUDA driver that queues (a warning said so)
            return None
        return queue, worker_bn(s), native

    def _staging(self):
        """This layer's host <-> device copies (bnps/torch/staging.py)."""
        staging = self.__dict__.get("_bnps_staging")
        if staging is None:
            staging = self.__dict__["_bnps_staging"] = Staging()
        return staging

    def _ones(self, channels, dtype, device):
        """A tensor of ones, kept (the backward reduction's stand-in
        weight)."""
        ones = self.__dict__.get("_bnps_ones")
        if ones is None or ones.shape[0] != channels or \
                ones.dtype != dtype or ones.device != device:
            ones = torch.ones(channels, dtype=dtype, device=device)
            self.__dict__["_bnps_ones"] = ones
        return ones

    def _exchange_forward(self, x):
        count, mean, m2 = local_moments(x, self._staging())
        if not self.training:  # no running stats: the input's own statistics
            return _stats(count, mean, _biased(count, m2))
        if self._recal_batch is not None:  # recalibrating
            # A layer without running statistics has nothing to recalibrate:
            # it normalizes with its own batch and sends nothing (the
            # workers' loaders may differ in length: no barriers here).
            if self.running_mean is not None:
                s = self._connection()
                s.client.bn_recal(self._recal_key, self._recal_batch, count,
                                  _np(mean), _np(m2))
                self._recal_batch += 1
            return _stats(count, mean, _biased(count, m2))
        return self._exchange_with_servers(self._connection(), count, mean,
                                           m2)

    def _exchange_with_servers(self, s, count, mean, m2):
        # The policy's rules are the C++ client's (client/worker_bn.h):
        # whether to send, what to normalize with, whether the backward
        # pass exchanges, how the running statistics follow. This moves
        # tensors: with a real client in one native call, with a stand-in
        # (tests) through its methods.
        rule = worker_bn(s)
        native = getattr(s.client, "native", None)
        if native is not None:
            return self._exchange_natively(rule, native, count, mean, m2)
        track = self.running_mean is not None
        rule.check_layer(self.bnps_name or "", track, self.momentum)
        exchange, want_running = rule.plan_forward(track)
        answer, name, step = None, None, None
        if exchange:
            name, step = self._name(), self._bnps_step
            answer = s.client.bn_forward(name, step, count, _np(mean),
                                         _np(m2), want_running=want_running)
            self._bnps_step += 1
        n, mu, mm2, global_backward, running = rule.resolve(
            count, _np(mean), _np(m2), answer)
        mu, mm2 = torch.from_numpy(mu), torch.from_numpy(mm2)
        if running == _native.RUNNING_FROM_BATCH:
            self._update_running(n, mu, mm2)
        elif running == _native.RUNNING_FROM_SERVERS:
            with torch.no_grad():
                self.running_mean.copy_(torch.from_numpy(answer[3]))
                self.running_var.copy_(torch.from_numpy(answer[4]))
                self.num_batches_tracked.add_(1)
        if not global_backward:
            name = step = None
        return _stats(n, mu, _biased(n, mm2), layer=name)

    def _exchange_natively(self, rule, native, count, mean, m2):
        """_exchange_with_servers in one call (bnps_layer_exchange_forward:
        the rule, the exchange and the running statistics' update, on this
        layer's float64 host copy of them)."""
        track = self.running_mean is not None
        self._check_named(rule, track)
        channels = mean.shape[0]
        mean, m2 = mean.contiguous(), m2.contiguous()
        stats = torch.empty(2, channels, dtype=torch.float64)
        info = torch.zeros(3, dtype=torch.int64)
        rm = rv = tracked = None
        if track:  # the host copy, updated in place only when the call succeeds
            n, rm, rv = self._running_on_host()
            tracked = torch.tensor([n], dtype=torch.int64)
        try:
            _native.layer_exchange_forward(
                rule, native, self.bnps_name or "", self._bnps_step, count,
                mean.data_ptr(), m2.data_ptr(), channels, self.momentum,
                _ptr(rm), _ptr(rv), _ptr(tracked), stats.data_ptr(),
                info.data_ptr())
        finally:
            n, exchanged, global_backward = info.tolist()
            name = self.bnps_name if global_backward else None
            self._bnps_step += exchanged
        if track:
            self._write_running(int(tracked[0]), rm, rv)
        return _Stats(n, stats, name)

    def _exchange_backward(self, stats, sum_dy, sum_dy_xhat):
        # Backward passes have their own count, in the order autograd runs
        # them (the same in every process), not the forward's step: a layer
        # applied twice per iteration (a siamese model) has its backward
        # passes in the reverse order of its forwards, and the servers
        # refuse a backward step below one they finished; a second backward
        # through one forward (retain_graph) needs a merge of its own, where
        # a repeated step would get the first pass's sums back.
        step = self._bnps_backward_step
        r = self._connection().client.bn_backward(stats.layer, step, sum_dy,
                                               sum_dy_xhat)
        self._bnps_backward_step += 1
        return r

    def _update_running(self, count, mean, m2):
        """running = (1 - m) running + m batch (unbiased variance), in
        float64, as torch does (client::UpdateRunning); momentum None: the
        cumulative average."""
        if self.running_mean is None:
            return
        tracked, rm_host, rv_host = self._running_on_host()
        tracked, rm, rv = _native.update_running(
            count, _np(mean), _np(m2), self.momentum, tracked,
            _np(rm_host), _np(rv_host))
        self._write_running(tracked, torch.from_numpy(rm),
                            torch.from_numpy(rv))

    def _write_running(self, tracked, rm, rv):
        """Writes the running statistics (float64 CPU tensors) and the count
        of batches into the buffers, and keeps what the buffers now hold as
        this layer's host copy."""
        rmb, rvb = self.running_mean, self.running_var
        # The values the buffers will hold (their dtype), then one copy of
        # both to their device.
        new = torch.stack([rm, rv]).to(rmb.dtype)
        both = self._staging().to_device("running", new, rmb.device, rmb.dtype)
        with torch.no_grad():
            self.num_batches_tracked.fill_(tracked)
            rmb.copy_(both[0], non_blocking=True)
            rvb.copy_(both[1], non_blocking=True)
        self.__dict__["_bnps_running"] = (
            self._running_key(), tracked, new[0].to(torch.float64),
            new[1].to(torch.float64))

    def _running_key(self):
        # (No device: host and CUDA addresses share one address space.
        # Each buffer read once: a module's attribute costs a lookup.)
        rm, rv = self.running_mean, self.running_var
        tracked = self.num_batches_tracked
        return (rm.data_ptr(), rm._version, rv.data_ptr(), rv._version,
                tracked.data_ptr(), tracked._version)

    def _running_on_host(self):
        """(num_batches_tracked, running_mean, running_var): an int and two
        float64 CPU tensors, from the host copy this layer keeps of what it
        last wrote; read from the buffers (a device sync on a GPU) only
        when one changed otherwise (load_state_dict, .to(), a user's
        write: a new tensor or a new version)."""
        kept = self.__dict__.get("_bnps_running")
        if kept is None or kept[0] != self._running_key():
            kept = (self._running_key(), int(self.num_batches_tracked),
                    self.running_mean.detach().to("cpu", torch.float64),
                    self.running_var.detach().to("cpu", torch.float64))
            self.__dict__["_bnps_running"] = kept
        return kept[1], kept[2], kept[3]


def worker_bn(connection):
    """The connection's policy rules (bnps._native.WorkerBn), made once."""
    rule = getattr(connection, "_bnps_worker_bn", None)
    if rule is None:
        rule = _native.WorkerBn(connection.config["policy"],
                                connection.config.get("bn_momentum", 0.1))
        connection._bnps_worker_bn = rule
    return rule


def _biased(count, m2):
    return m2 / count if count > 0 else torch.zeros_like(m2)
