"""SyncBatchNorm under torch.compile: on torch >= 2.4 the layer's training
forward and backward are the custom ops bnps::batch_norm_v3 and
bnps::batch_norm_backward_v3 (torch.library.custom_op, with fake
implementations and the autograd registration), so that Dynamo puts them in
the graph as opaque calls instead of breaking it at the exchange with the
servers, and `torch.compile(model, fullgraph=True)` works. The ops run the
same code as the eager autograd Function (_layer_ops.forward and
backward, which choose the route again when the op runs: _routes.py), so
compiled and eager give the same bits.

Eager mode (not compiling) keeps the autograd Function: a custom op's
dispatch costs more per call. On torch < 2.4 nothing is registered and the
layer always runs the Function (torch.compile breaks the graph there).

The ops name their layer by an integer id: a custom op takes tensors and
scalars, not modules. Each SyncBatchNorm registers itself here when made (or
copied, or unpickled); the registry holds it weakly.

Where the connection queues (bnps/torch/stream_exchange.py: on CUDA by
default), the forward op queues its exchange on the stream as in eager
mode. What its backward needs (the queued statistics and the C++ outcome)
is not a tensor: the op holds it here under a token written into its
`info` output, for as long as that tensor lives (AOT autograd saves it for
the backward op, which reads it by the token; a forward without a backward
frees it with its outputs). The `moments` output then holds zeros: the statistics are still
on their way when the op returns. These two tables are this package's
process-wide state, and only this module touches them.

Side effects the ops do not declare to torch: the exchanges with the
servers, the layer's step counters and its running statistics (updated in
place, as in eager mode). The compiled graph never reads those buffers in
training mode, and in eval mode they are graph inputs, read when it runs.
"""

import inspect
import itertools
import threading
import weakref
from typing import Optional, Tuple

import torch

from bnps.torch import _layer_ops
from bnps.torch._device_route import FusedStats
from bnps.torch.stream_exchange import QueuedStats

_lock = threading.Lock()
_layers = weakref.WeakValueDictionary()  # id -> SyncBatchNorm
_ids = itertools.count()
_held = {}                                # token -> QueuedStats
_tokens = itertools.count(1)              # 0: nothing held


def _version_at_least(major, minor):
    try:
        parts = torch.__version__.split("+")[0].split(".")
        return (int(parts[0]), int(parts[1])) >= (major, minor)
    except (ValueError, IndexError):
        return False


# torch.library.custom_op and register_autograd arrived in torch 2.4.
SUPPORTED = _version_at_least(2, 4) and hasattr(torch.library, "custom_op")


def _op_tags():
    """custom_op's tags= where this torch has them: cudagraph_unsafe, since
    an op that talks to the servers (or queues a host function) must run
    every step, not be captured into a CUDA graph and replayed
    (torch.compile(mode="reduce-overhead") then keeps CUDA graphs around
    the layers, or skips them, instead)."""
    tag = getattr(getattr(torch, "Tag", None), "cudagraph_unsafe", None)
    try:
        takes_tags = "tags" in inspect.signature(
            torch.library.custom_op).parameters
    except (TypeError, ValueError):
        takes_tags = False
    return {"tags": (tag,)} if tag is not None and takes_tags else {}


def register(layer):
    """A new id for `layer` (held weakly); its ops name it by that id."""
    with _lock:
        i = next(_ids)
        _layers[i] = layer
    return i


def compiling():
    """Whether Dynamo is tracing now and the ops exist (a constant for
    Dynamo, so the branch costs nothing in the graph)."""
    return SUPPORTED and torch.compiler.is_compiling()


def _hold(stats, info):
    """A token for `stats`, held while `info` (the forward op's output that
    carries the token) lives."""
    with _lock:
        token = next(_tokens)
        _held[token] = stats
    weakref.finalize(info, _release, token)
    return token


def _release(token):
    with _lock:
        _held.pop(token, None)


def _take(token):
    """What _hold holds under `token` (kept: a backward pass may run again
    with retain_graph)."""
    with _lock:
        stats = _held.get(token)
    if stats is None:
        raise RuntimeError(f"bnps: the queued statistics of forward {token} "
                           f"are gone (its saved output was freed)")
    return stats


def held():
    """How many queued forwards the ops hold now (tests)."""
    with _lock:
        return len(_held)


def _layer(i):
    layer = _layers.get(i)
    if layer is None:
        raise RuntimeError(f"bnps: no SyncBatchNorm with id {i} (the layer "
                           f"was freed)")
    return layer


if SUPPORTED:
    # The ops' names carry the version of their signature: torch.compile's
    # on-disk caches (Inductor's FX graph cache) key a compiled graph by the
    # ops it calls, so a changed signature under an old name would reuse a
    # graph compiled for the old one after an upgrade of bnps.
    @torch.library.custom_op("bnps::batch_norm_v3", mutates_args=(),
                             **_op_tags())
    def batch_norm(x: torch.Tensor, weight: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor], layer: int, eps: float
                   ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(y, moments, info): the output; the mean and biased variance it
        normalized with (float64, CPU, 2 x C; zeros where the exchange was
        queued); info = [count, synced, token] (int64, CPU; synced: the
        backward pass merges across workers; token: the queued forward's
        statistics held here, 0 if none)."""
        bn = _layer(layer)
        y, stats = _layer_ops.forward(bn, x, weight, bias, eps)
        if isinstance(stats, (QueuedStats, FusedStats)):
            moments = torch.zeros(2, x.shape[1], dtype=torch.float64)
            info = torch.tensor([0, int(stats.layer is not None), 0],
                                dtype=torch.int64)
            info[2] = _hold(stats, info)
            return y, moments, info
        info = torch.tensor([stats.count, int(stats.layer is not None), 0],
                            dtype=torch.int64)
        return y, stats.moments, info

    @batch_norm.register_fake
    def _(x, weight, bias, layer, eps):
        c = x.shape[1]
        return (torch.empty_like(x),
                torch.empty(2, c, dtype=torch.float64, device="cpu"),
                torch.empty(3, dtype=torch.int64, device="cpu"))

    @torch.library.custom_op("bnps::batch_norm_backward_v3", mutates_args=(),
                             **_op_tags())
    def batch_norm_backward(
            dy: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
            moments: torch.Tensor, info: torch.Tensor, layer: int, eps: float,
            need_dx: bool
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dx, dweight, dbias); dx empty unless need_dx, dweight and dbias
        empty without a weight."""
        bn = _layer(layer)
        count, synced, token = info.tolist()
        stats = _take(token) if token else _layer_ops.Stats(
            count, moments, layer=bn._name() if synced else None)
        dx, dweight, dbias = _layer_ops.backward(bn, x, weight, dy, stats, eps,
                                                 need_dx)
        def none():  # a fresh one each: a custom op's outputs never alias
            return torch.empty(0, dtype=x.dtype, device=x.device)
        return (none() if dx is None else dx,
                none() if dweight is None else dweight,
                none() if dbias is None else dbias)

    @batch_norm_backward.register_fake
    def _(dy, x, weight, moments, info, layer, eps, need_dx):
        return (torch.empty_like(x) if need_dx else x.new_empty(0),
                x.new_empty(0) if weight is None else torch.empty_like(weight),
                x.new_empty(0) if weight is None else torch.empty_like(weight))

    def _setup_context(ctx, inputs, output):
        x, weight, _, layer, eps = inputs
        _, moments, info = output
        ctx.save_for_backward(x, weight, moments, info)
        ctx.mark_non_differentiable(moments, info)
        ctx.layer, ctx.eps = layer, eps

    def _autograd_backward(ctx, dy, _moments, _info):
        x, weight, moments, info = ctx.saved_tensors
        dx, dweight, dbias = batch_norm_backward(
            dy, x, weight, moments, info, ctx.layer, ctx.eps,
            ctx.needs_input_grad[0])
        if not ctx.needs_input_grad[0]:
            dx = None
        if weight is None:
            dweight = dbias = None
        return dx, dweight, dbias, None, None

    batch_norm.register_autograd(_autograd_backward,
                                 setup_context=_setup_context)
