"""bnps for PyTorch: SyncBatchNorm backed by a bnps job's shard servers, on
CPU and GPU, under every policy of the servers (sync, async, local, recal).

Switching a model is one line, as with torch.nn.SyncBatchNorm:

    import bnps.torch
    connection = bnps.torch.init()                   # BNPS_* environment
    model = bnps.torch.convert_sync_batchnorm(model)

See docs/pytorch.md for set-up, the policies and the differences from
torch.nn.SyncBatchNorm.
"""

from bnps.torch.connection import Connection, default_connection, init
from bnps.torch.sync_batchnorm import SyncBatchNorm, local_moments
from bnps.torch.convert import (convert_sync_batchnorm, name_layers,
                                recalibrate, sync_running_stats)
from bnps.torch.optimizer import ParameterServerOptimizer

__all__ = ["ParameterServerOptimizer", "Connection", "SyncBatchNorm",
           "convert_sync_batchnorm",
           "default_connection", "init", "local_moments", "name_layers",
           "recalibrate", "sync_running_stats"]
