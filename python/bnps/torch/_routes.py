"""The route a bnps.torch.SyncBatchNorm pass takes, chosen in one place.

A pass's route follows from a few facts about it (Facts: training or eval,
running statistics, recalibration, torch.compile tracing, CUDA-graph
capture, the input's device, dtype and memory layout, whether the
connection queues exchanges on the device's stream) through one table,
choose() for the forward pass and choose_backward() for its backward, the
way torch's nn/modules/batchnorm.py decides in one function which kernel a
BatchNorm runs. The layer (sync_batchnorm.py) and the compiled ops
(custom_ops.py) dispatch on the answer (_layer_ops.py runs each route).

    EVAL            eval mode with running statistics: torch's batch_norm
                    in inference form; nothing is sent.
    OWN_STATISTICS  eval mode without running statistics: the input's own
                    statistics (torch operations); nothing is sent.
    COMPILED        torch.compile is tracing (torch >= 2.4): the custom ops
                    go into the graph, and choose again when they run.
    NATIVE_CPU      float32 CPU input and state in (N, C, *) order: one
                    native call per pass (the C++ worker's kernels around
                    the exchange).
    FUSED           the connection queues on the input's device (CUDA by
                    default): torch's fused batch-norm kernels (those of
                    torch.nn.SyncBatchNorm) around ONE native call per
                    pass, which queues on the stream the statistics' copy
                    to the host, the exchange and the copies of its results
                    (_device_route.py); the host never waits for the device,
                    and a CUDA graph captures it. On the CPU (stream_exchange
                    on) the kernels' CPU stand-in runs the same native code.
    QUEUED          where FUSED cannot take the input (an empty batch,
                    16-bit running statistics, no such calls in the CUDA
                    driver): torch operations, the exchange queued on the
                    stream; the host never waits for the device.
    WAITING         any other training pass: torch operations on the
                    input's device, the exchange in one native call that
                    waits for its answer.
    RECALIBRATING   bnps.torch.recalibrate's passes: torch operations, the
                    batch's moments sent for the population statistics.

Where a pass asks for what its input cannot have (an exchange queued on the
stream for the CPU's native float32 path, a strided float32 CPU input the
native call cannot read in place, FUSED for input it cannot take), it takes
a correct route and the layer warns once (Fallback). What no route can
serve raises RouteError: a training pass captured in a CUDA graph on any
route but FUSED (recalibration, a connection that does not queue, input
FUSED cannot take: its exchange, or its running statistics' update, would
happen on the host when captured and not at the replays), or CUDA input
while another device is current (the queued exchange runs in the current
device's context).
"""

import collections
import math
import warnings

import torch

from bnps.torch import _device_route

EVAL = "eval"
OWN_STATISTICS = "own statistics"
COMPILED = "compiled"
NATIVE_CPU = "native cpu"
FUSED = "fused"
QUEUED = "queued"
WAITING = "waiting"
RECALIBRATING = "recalibrating"

ROUTES = (EVAL, OWN_STATISTICS, COMPILED, NATIVE_CPU, FUSED, QUEUED, WAITING,
          RECALIBRATING)

# The input's layout, as the routes need to know it.
CONTIGUOUS = "contiguous"  # (N, C, *) in order: the native call reads it
STRIDED = "strided"        # any other: torch operations read it


class RouteError(RuntimeError):
    """A pass that no route can serve."""


class Fallback(UserWarning):
    """A pass took a slower route than the one asked for (said once per
    layer and cause)."""


# Everything the routes depend on.
#   training        the layer is in training mode
#   tracks_running  it has running statistics (track_running_stats=True)
#   recalibrating   bnps.torch.recalibrate is running it
#   compiling       torch.compile traces it and the custom ops exist
#   capturing       the current CUDA stream captures a graph
#   device          "cpu", "cuda", ...
#   float32_state   x, weight, bias and the running buffers are float32 on
#                   the CPU (each that exists), with non-empty samples
#   layout          CONTIGUOUS (all of those in order) or STRIDED
#   queues          the connection queues exchanges on the device's stream
#                   (Connection.queues_on) and can make the queue
#   other_device    CUDA input while another CUDA device is current
#   policy          the job's BN policy (for messages)
#   unfused         None where FUSED can take the pass (_device_route.
#                   blocker), else why not ("" for an empty batch, which
#                   QUEUED takes without a warning)
Facts = collections.namedtuple("Facts", [
    "training", "tracks_running", "recalibrating", "compiling", "capturing",
    "device", "float32_state", "layout", "queues", "other_device", "policy",
    "unfused"], defaults=(None,))


def choose(f):
    """The forward pass's route for Facts `f`: (route, fallback), fallback
    None or the message of a Fallback warning (the layer says it once).
    RouteError where no route serves `f`."""
    if not f.training:
        if f.tracks_running:
            return EVAL, None
        return OWN_STATISTICS, None
    if f.compiling:
        return COMPILED, None
    if f.capturing and not (f.queues and f.unfused is None and
                            not f.recalibrating and not f.other_device):
        _refuse_capture(f)
    if f.recalibrating:
        return RECALIBRATING, None
    if f.float32_state and f.device == "cpu":
        if f.layout == CONTIGUOUS:
            if f.queues:
                return NATIVE_CPU, (
                    "float32 CPU input takes the native call, whose exchange "
                    "waits for its answer inside the call; the connection's "
                    "stream_exchange does not apply to it")
            return NATIVE_CPU, None
        return (_queued_route(f) if f.queues else WAITING), (
            "float32 CPU input that is not contiguous in (N, C, *) order "
            "takes torch operations, several times slower than the native "
            "call; pass x.contiguous() to avoid it")
    if f.queues:
        if f.other_device:
            raise RouteError(
                "bnps SyncBatchNorm: the input is on another CUDA device than "
                "the current one; its exchange would be queued in the wrong "
                "device's context. Make the input's device current "
                "(torch.cuda.set_device, or `with torch.cuda.device(x.device)"
                "`)")
        return _queued_route(f), (f.unfused or None)
    return WAITING, None


def _queued_route(f):
    """FUSED where it can take the pass, else QUEUED."""
    return FUSED if f.unfused is None else QUEUED


def _refuse_capture(f):
    """RouteError for a training pass captured on a route a replay would
    not repeat, saying which and why."""
    if f.recalibrating:
        why = ("recalibration sends the batch's moments from Python, which a "
               "replay of the graph would skip")
    elif not f.queues:
        why = ("the connection does not queue exchanges on the stream "
               "(stream_exchange off), so each exchange waits on the host, "
               "which a replay would skip; leave stream_exchange on")
    elif f.unfused is not None:
        why = (f"the pass cannot take the fused route "
               f"({f.unfused or 'an empty batch'}), and the queued route "
               f"reads the layer's state on the host, which a replay would "
               f"skip")
    else:
        why = "the input is on another CUDA device than the current one"
    raise RouteError(
        f"bnps SyncBatchNorm: a training-mode pass cannot be captured in a "
        f"CUDA graph under the {f.policy!r} policy: {why}. Capture the "
        f"model in eval mode, or keep the bnps layers out of the graph")


def choose_backward(forward_queued, native_ok, fused=False):
    """The backward pass's route: FUSED after a FUSED forward (`fused`),
    its forward's queue where that queued (QUEUED), else NATIVE_CPU where
    x, weight and dy suit the native call (`native_ok`), else WAITING."""
    if fused:
        return FUSED
    if forward_queued:
        return QUEUED
    return NATIVE_CPU if native_ok else WAITING


def native_shape(x, *others):
    """(n, channels, spatial) of x where the native layer steps take it:
    float32 CPU x in contiguous (N, C, *) order with non-empty samples,
    with float32 CPU contiguous `others` (each may be None); else None."""
    for t in (x,) + others:
        if t is not None and (t.dtype != torch.float32 or not t.is_cpu or
                              not t.is_contiguous()):
            return None
    spatial = samples(x)
    return (x.shape[0], x.shape[1], spatial) if spatial > 0 else None


def facts(bn, x, weight, bias, connection, compiling):
    """The Facts of a pass of `bn` (SyncBatchNorm) on `x` through
    `connection` (None: eval mode, which needs none). (Called for every
    pass: one look at each tensor.)"""
    training = bn.training
    buffers = bn._buffers  # (nn.Module's attributes cost a lookup each)
    rm = buffers.get("running_mean")
    tracks = rm is not None
    device = x.device.type
    capturing = device == "cuda" and torch.cuda.is_current_stream_capturing()
    if not training or compiling:
        return Facts(training, tracks, False, compiling, capturing, device,
                     False, CONTIGUOUS, False, False, None, None)
    float32_state, layout = device == "cpu", CONTIGUOUS
    for t in (x, weight, bias, rm, buffers.get("running_var")):
        if t is not None:
            if t.dtype != torch.float32 or not t.is_cpu:
                float32_state = False
            if not t.is_contiguous():
                layout = STRIDED
    if float32_state:
        float32_state = samples(x) > 0 and \
            (not tracks or buffers.get("num_batches_tracked") is not None)
    queues = connection.queues_on(x.device) and \
        connection.exchange_queue(x.device) is not None
    other = device == "cuda" and x.device.index != torch.cuda.current_device()
    unfused = _device_route.blocker(bn, x, connection) if queues else None
    return Facts(True, tracks, bn._recal_batch is not None, False, capturing,
                 device, float32_state, layout, queues, other,
                 connection.policy, unfused)


def samples(x):
    """Values per sample and channel (1 for (N, C) input)."""
    return math.prod(x.shape[2:])


def warn_once(bn, message):
    """A Fallback warning of `message`, once per layer."""
    said = bn.__dict__.setdefault("_bnps_warned", set())
    if message not in said:
        said.add(message)
        warnings.warn(f"bnps SyncBatchNorm {bn.bnps_name!r}: {message}",
                      Fallback, stacklevel=4)
