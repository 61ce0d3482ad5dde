"""Converting a whole model to bnps.torch's SyncBatchNorm and back, for the
trainers' layer-sync hooks (bnps.lightning's plugin; torch only, no trainer
package needed):

    model = bnps.layer_sync.apply(model, connection)   # every policy
    ...train...
    model = bnps.layer_sync.revert(model)   # plain BatchNorm, trained stats

apply refuses a model wrapped in torch.nn.DataParallel (one process driving
several devices: bnps serves one process per device) with a ValueError
naming it. revert gives each layer back the class it had (BatchNorm1d, 2d,
3d; a layer bnps made itself becomes a BatchNorm of any dimension), with the
same Parameter objects, running statistics, training flag, device and
dtype, so a checkpoint of the reverted model loads into a plain model."""

import torch
from torch import nn

from bnps.torch.convert import carry_batchnorm, convert_sync_batchnorm
from bnps.torch.sync_batchnorm import SyncBatchNorm


class BatchNormXd(nn.modules.batchnorm._BatchNorm):
    """A plain BatchNorm for input of any dimension: a reverted layer whose
    original class is unknown (torch's own BatchNorm behaviour)."""

    def _check_input_dim(self, x):
        if x.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {x.dim()}D)")


def _refuse_wrappers(model):
    if isinstance(model, nn.DataParallel):
        raise ValueError(
            "bnps: torch.nn.DataParallel (one process driving several "
            "devices) cannot be served: run one process per device "
            "(DistributedDataParallel, Lightning's strategy='ddp')")


def device_type(model):
    """The device type ("cpu", "cuda", ...) of the model's parameters and
    buffers; ValueError naming them when the model spans several types."""
    types = sorted({t.device.type for t in
                    list(model.parameters()) + list(model.buffers())})
    if len(types) > 1:
        raise ValueError(f"bnps: the model lies on devices of several types "
                         f"({', '.join(types)}); put it on one")
    return types[0] if types else "cpu"


def check_same_device_type(mine, gather):
    """Raises ValueError naming every rank's device type unless all ranks
    train on the same type as this one (`mine`); `gather(obj)` returns the
    list of every rank's `obj` (torch.distributed.all_gather_object's)."""
    types = gather(mine)
    if len(set(types)) > 1:
        ranks = ", ".join(f"rank {r}: {t}" for r, t in enumerate(types))
        raise ValueError(f"bnps: the ranks train on different device types "
                         f"({ranks}); every worker of a bnps job must use "
                         f"the same type (its layers take one route)")


def _all_gather(obj):
    import torch.distributed as dist
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def apply(model, connection=None, prefix=""):
    """convert_sync_batchnorm(model) remembering each layer's class for
    revert; returns the model (a new one if `model` is a BatchNorm). Where a
    torch.distributed process group exists, every rank must train on the
    same device type (ValueError naming each rank's otherwise; a collective
    call: every rank calls apply)."""
    _refuse_wrappers(model)
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        check_same_device_type(device_type(model), _all_gather)
    kinds = {name: type(m) for name, m in model.named_modules()
             if isinstance(m, nn.modules.batchnorm._BatchNorm) and
             not isinstance(m, SyncBatchNorm)}
    out = convert_sync_batchnorm(model, prefix=prefix, connection=connection)
    for name, m in out.named_modules():
        if isinstance(m, SyncBatchNorm) and name in kinds:
            cls = kinds[name]
            m._bnps_reverts_to = BatchNormXd if cls is nn.SyncBatchNorm \
                else cls
    return out


def _plain(m):
    return carry_batchnorm(m, getattr(m, "_bnps_reverts_to", BatchNormXd))


def revert(model):
    """Every bnps SyncBatchNorm of `model` back to a plain BatchNorm, in
    place; returns the model (a new one if `model` itself is one)."""
    out = _plain(model) if isinstance(model, SyncBatchNorm) else model
    for name, child in model.named_children():
        out.add_module(name, revert(child))
    return out
