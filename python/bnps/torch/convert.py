"""Whole-model helpers: convert_sync_batchnorm and name_layers (layer names),
and settling the running statistics across workers after training:
sync_running_stats (every policy but recal) and recalibrate (any policy)."""

import torch
from torch import nn

from bnps import _native
from bnps.torch import connection as _connection
from bnps.torch._layer_ops import np_ as _np, worker_bn
from bnps.torch.sync_batchnorm import SyncBatchNorm


def name_layers(module, prefix="", rename=False):
    """Names every SyncBatchNorm of `module` that has no name yet by its
    qualified module name (with `prefix`), and returns `module`. With
    rename=True every one, named or not, and their step counts start
    again: a copy of a model (copy.deepcopy, torch.load) that trains beside
    the original needs names of its own in the job."""
    for qualified, m in module.named_modules():
        if isinstance(m, SyncBatchNorm) and (rename or not m.bnps_name):
            m.bnps_name = prefix + (qualified or "bn")
            if rename:
                m._bnps_step = m._bnps_backward_step = 0
    return module


def convert_sync_batchnorm(module, process_group=None, prefix="",
                           connection=None):
    """Replaces every torch.nn.BatchNorm1d/2d/3d (and torch.nn.SyncBatchNorm)
    of `module` in place by a bnps SyncBatchNorm with the same arguments,
    keeping its parameters (the same Parameter objects, so an optimizer made
    before still updates them), running statistics, training flag and
    device, and names every bnps layer by its qualified module name.
    `process_group` as torch's (None: the whole job; SyncBatchNorm says which
    groups bnps runs). Returns the module (a new one if `module` itself is a
    BatchNorm)."""
    out = _convert(module, connection, process_group)
    return name_layers(out, prefix)


def carry_batchnorm(module, make):
    """A BatchNorm layer made by `make(num_features, eps, momentum, affine,
    track_running_stats, device=, dtype=)` that carries `module`'s
    parameters (the same Parameter objects), running statistics, training
    flag and qconfig: how a layer is swapped either way (to bnps here, back
    to torch's in bnps.layer_sync)."""
    ref = module.weight if module.weight is not None else module.running_mean
    out = make(module.num_features, module.eps, module.momentum,
               module.affine, module.track_running_stats,
               device=None if ref is None else ref.device,
               dtype=None if ref is None else ref.dtype)
    if module.affine:
        with torch.no_grad():
            out.weight = module.weight
            out.bias = module.bias
    out.running_mean = module.running_mean
    out.running_var = module.running_var
    out.num_batches_tracked = module.num_batches_tracked
    out.training = module.training
    if hasattr(module, "qconfig"):
        out.qconfig = module.qconfig
    return out


def _convert(module, connection, process_group):
    out = module
    if isinstance(module, nn.modules.batchnorm._BatchNorm) and \
            not isinstance(module, SyncBatchNorm):
        out = carry_batchnorm(
            module, lambda *args, **kw: SyncBatchNorm(
                *args, process_group=process_group, connection=connection,
                **kw))
    for child_name, child in module.named_children():
        out.add_module(child_name, _convert(child, connection,
                                                 process_group))
    return out


def _layers(model):
    return sorted(((m.bnps_name or "", m) for m in model.modules()
                   if isinstance(m, SyncBatchNorm)), key=lambda p: p[0])


def _copy_running(m, mean, var):
    with torch.no_grad():
        m.running_mean.copy_(torch.from_numpy(mean))
        m.running_var.copy_(torch.from_numpy(var))


def _round_key(m, kind):
    """The servers' key for the layer's next settling of `kind` ("local" or
    "recal"): its name the first time, then name#<kind><k>. The servers
    merge each key once (a repeated local average answers with the first;
    a finished recalibration refuses more batches), so each round needs its
    own; every worker counts the rounds alike, as it calls them alike."""
    k = m._bnps_rounds.get(kind, 0)
    m._bnps_rounds[kind] = k + 1
    return m._name() if k == 0 else f"{m._name()}#{kind}{k}"


def sync_running_stats(model, connection=None):
    """Makes every SyncBatchNorm's running statistics the job's: under sync
    nothing to do (every worker updated them with the same global moments);
    under async the servers' latest (training copies them in each step);
    under local the average over the workers (a barrier per layer: every
    worker must call it; each call is a round of its own). Under recal use
    recalibrate (bnps.FailedPrecondition, a RuntimeError). Which applies is
    the C++ client's rule (client/worker_bn.h). Returns the number of layers
    settled."""
    s = connection or _connection.default_connection()
    s.drain_exchanges()  # the running statistics queued exchanges write
    settle = worker_bn(s).settle()
    if settle == _native.SETTLE_NOTHING:
        return 0
    n = 0
    for name, m in _layers(model):
        if m.running_mean is None:
            continue
        if settle == _native.SETTLE_WORKERS_AVERAGE:
            mean, var = s.client.bn_local_running(
                _round_key(m, "local"),
                _np(m.running_mean.to(torch.float64).cpu()),
                _np(m.running_var.to(torch.float64).cpu()))
        else:
            mean, var = s.client.bn_running(m._name(), m.num_features)
        _copy_running(m, mean, var)
        n += 1
    return n


def recalibrate(model, loader, connection=None, num_batches=None, device=None):
    """Recomputes every SyncBatchNorm's running statistics as the population
    statistics of the data of every worker: each worker runs its `loader`
    (batches of inputs, or tuples whose first element is the input) through
    the model in training mode without gradients, each layer sends the
    moments of each batch to the servers, and once a worker's batches are
    done the servers merge all workers' batches per layer (a barrier: every
    worker must call this). Works under every policy, as often as wanted
    (each call is a round of its own); it is how recal settles the
    statistics. Returns the number of batches this worker ran."""
    s = connection or _connection.default_connection()
    s.drain_exchanges()
    # Every bnps layer is in recalibration mode, so that none talks to the
    # servers' sync or async exchanges (whose steps the training owns); those
    # with running statistics file their batches' moments.
    every = [m for _, m in _layers(model)]
    layers = [m for m in every if m.running_mean is not None]
    modes = [(m, m.training) for m in model.modules()]
    model.train()
    for m in every:
        m._recal_batch = 0
    for m in layers:
        m._recal_key = _round_key(m, "recal")
    batches = 0
    try:
        with torch.no_grad():
            for i, batch in enumerate(loader):
                if num_batches is not None and i >= num_batches:
                    break
                x = batch[0] if isinstance(batch, (list, tuple)) else batch
                if device is not None:
                    x = x.to(device)
                model(x)
                batches += 1
    finally:
        for m in every:
            m._recal_batch = None
        for m, training in modes:  # each module's own flag, as it was
            m.training = training
    for m in layers:
        mean, var = s.client.bn_recal_finish(m._recal_key)
        _copy_running(m, mean, var)
    return batches
