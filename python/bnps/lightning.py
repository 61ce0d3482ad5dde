"""bnps for PyTorch Lightning: a LayerSync plugin, as Lightning's own
TorchSyncBatchNorm, that converts the model's BatchNorm layers to bnps.torch's
SyncBatchNorm (under the job's policy: sync, async, local or recal) and back.

    import bnps.lightning
    trainer = lightning.pytorch.Trainer(
        strategy="ddp", devices=2, accelerator="cpu",
        plugins=[bnps.lightning.BnpsSyncBatchNorm()])

apply() runs in the strategy's set-up, once the process group exists: with
no connection given and none open, it opens one with bnps.torch.init(
**init_args), the worker id and count being the process group's rank and
size (the rest from the BNPS_* environment). revert() gives back plain BatchNorm with
the trained statistics, so a checkpoint written under the plugin loads
into a plain model. Needs the `lightning` package (or the older
`pytorch_lightning`); without either, importing this module raises
ImportError saying what to install."""

try:
    from lightning.pytorch.plugins import LayerSync
except ImportError:
    try:
        from pytorch_lightning.plugins import LayerSync
    except ImportError:
        raise ImportError(
            "bnps.lightning needs PyTorch Lightning: pip install lightning "
            "(or pytorch_lightning)") from None

from bnps import layer_sync as _layer_sync
from bnps.torch import connection as _connection


class BnpsSyncBatchNorm(LayerSync):
    """Lightning's LayerSync through bnps.torch. `connection`: the job's
    (default: the default connection, or one opened by
    bnps.torch.init(**init_args) at apply()); `prefix`: the layers' name
    prefix in the job."""

    def __init__(self, connection=None, prefix="", **init_args):
        self.connection = connection
        self.prefix = prefix
        self.init_args = init_args

    def _connection(self):
        if self.connection is not None:
            return self.connection
        try:
            return _connection.default_connection()
        except RuntimeError:
            self.connection = _connection.init(**self._placed(self.init_args))
            return self.connection

    @staticmethod
    def _placed(args):
        """`args` with the worker id and count of the strategy's process
        group where it exists and they are not given: Lightning's launcher
        does not always set RANK in its first process."""
        import torch.distributed as dist
        args = dict(args)
        if dist.is_available() and dist.is_initialized():
            args.setdefault("worker", dist.get_rank())
            args.setdefault("num_workers", dist.get_world_size())
        return args

    def apply(self, model):
        return _layer_sync.apply(model, self._connection(), self.prefix)

    def revert(self, model):
        return _layer_sync.revert(model)
