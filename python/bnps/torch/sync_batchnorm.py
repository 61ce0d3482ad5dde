"""bnps.torch.SyncBatchNorm: batch normalization whose statistics are merged
across the workers of a bnps job by its shard servers.

In training mode a layer computes its input's per-channel moments (count,
mean, M2), sends them in float64 through the client, and normalizes with
what the servers' policy gives back. Which route a pass takes is decided
in one place, bnps/torch/_routes.py (its table names them all), and run by
bnps/torch/_layer_ops.py: contiguous float32 input on the CPU takes one
native call per pass (bnps._native.layer_forward and layer_backward: the
C++ worker's CPU kernels around the exchange); other input runs torch
operations on its own device (accumulating in float32 for float16/bfloat16
input, in the input's precision otherwise), with the exchange queued on
the device's stream (CUDA by default) or waited for.

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
from bnps.torch import _layer_ops
from bnps.torch import _routes
from bnps.torch import channels as channels_
from bnps.torch import custom_ops as _ops
from bnps.torch import groups as _groups
from bnps.torch import connection as _connection
from bnps.torch._layer_ops import (Stats, local_moments, np_ as _np, ptr,
                                   stats_of as _stats, worker_bn)
from bnps.torch.staging import Staging

__all__ = ["SyncBatchNorm", "local_moments", "worker_bn"]


def _backward(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, dweight, dbias = _layer_ops.backward(
        ctx.bn, x, weight, dy, ctx.stats, ctx.eps, ctx.needs_input_grad[0])
    return dx, dweight, dbias, None, None, None


# The exchanged statistics are constants here: a second derivative would be
# silently wrong, so a backward pass that records a graph (create_graph)
# gets once_differentiable's outputs, which refuse one.
_backward_once = once_differentiable(_backward)


class _SyncBatchNormFunction(torch.autograd.Function):
    """The layer's training-mode forward and backward in eager mode (and on
    torch < 2.4 always), on the route the layer chose (_layer_ops.py)."""

    @staticmethod
    def forward(ctx, x, weight, bias, bn, eps, route):
        y, stats = _layer_ops.forward(bn, x, weight, bias, eps, route)
        ctx.save_for_backward(x, weight)
        ctx.stats = stats
        ctx.bn = bn
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, dy):
        if torch.is_grad_enabled():  # create_graph: once_differentiable's
            return _backward_once(ctx, dy)
        # (What once_differentiable does where no graph is recorded: its
        # no_grad block and checks cost more than the pass's own work.)
        return _backward(ctx, dy)


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
        # Backward passes synced so far: their own count, in the order
        # autograd runs them (the same in every process), not the forward's
        # step. A layer applied twice per iteration (a siamese model) has
        # its backward passes in the reverse order of its forwards, and the
        # servers refuse a backward step below one they finished; a second
        # backward through one forward (retain_graph) needs a merge of its
        # own, where a repeated step would get the first pass's sums back.
        self._bnps_backward_step = 0
        self._recal_batch = None  # not None: the next recalibration batch
        self._recal_key = None    # the servers' key of this recalibration
        self._bnps_rounds = {}    # settling rounds so far (convert.py)
        self._bnps_op_id = _ops.register(self)  # for torch.compile

    # Per-process caches (pinned buffers, CUDA events, the host copy of the
    # running statistics), made again when needed: never copied or pickled.
    _CACHES = ("_bnps_staging", "_bnps_ones", "_bnps_running",
               "_bnps_queued", "_bnps_warned", "_bnps_plan",
               "_bnps_device_plan")

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
        compiling = _ops.compiling()
        if self.training and not compiling and not self._bnps_group_checked:
            _groups.check_process_group(self.process_group,
                                        self._connection())
            self._bnps_group_checked = True
        # (The parameters read once, from their dict: a module's attribute
        # costs a call of its __getattr__.)
        params = self._parameters
        weight, bias = params.get("weight"), params.get("bias")
        route = _layer_ops.choose(self, x, weight, bias, compiling)
        if route == _routes.EVAL:
            return self._eval_forward(x)
        if route == _routes.OWN_STATISTICS:
            return self._own_statistics_forward(x)
        if route == _routes.COMPILED:  # torch >= 2.4 under torch.compile
            return _ops.batch_norm(x, weight, bias, self._bnps_op_id,
                                   self.eps)[0]
        return _SyncBatchNormFunction.apply(x, weight, bias, self, self.eps,
                                            route)

    def _eval_forward(self, x):
        acc = channels_.acc_dtype(x.dtype)
        y = F.batch_norm(
            x.to(acc), self.running_mean.to(acc), self.running_var.to(acc),
            None if self.weight is None else self.weight.to(acc),
            None if self.bias is None else self.bias.to(acc), False, 0.0,
            self.eps)
        return y.to(x.dtype)

    def _own_statistics_forward(self, x):
        """Eval mode without running statistics: the input's own, as torch
        normalizes (nothing is sent)."""
        acc = channels_.acc_dtype(x.dtype)
        y = F.batch_norm(
            x.to(acc), None, None,
            None if self.weight is None else self.weight.to(acc),
            None if self.bias is None else self.bias.to(acc), True, 0.0,
            self.eps)
        return y.to(x.dtype)

    # --- the exchanges, called by _SyncBatchNormFunction ---

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
        """The statistics a WAITING or RECALIBRATING pass normalizes with
        (a Stats)."""
        count, mean, m2 = local_moments(x, self._staging())
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
        s = self._connection()
        return self._exchange_natively(worker_bn(s), s.client.native, count,
                                       mean, m2)

    def _exchange_natively(self, rule, native, count, mean, m2):
        """A WAITING pass's exchange in one call (bnps_layer_exchange_forward:
        the policy's rules (client/worker_bn.h), the exchange and the
        running statistics' update, on this layer's float64 host copy of
        them)."""
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
                ptr(rm), ptr(rv), ptr(tracked), stats.data_ptr(),
                info.data_ptr())
        finally:
            n, exchanged, global_backward = info.tolist()
            name = self.bnps_name if global_backward else None
            self._bnps_step += exchanged
        if track:
            self._write_running(int(tracked[0]), rm, rv)
        return Stats(n, stats, name)

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


def _biased(count, m2):
    return m2 / count if count > 0 else torch.zeros_like(m2)
