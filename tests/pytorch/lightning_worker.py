"""One rank of lightning_test: lightning_cases' job through PyTorch
Lightning's Trainer (DDP over gloo, launched from outside as torchrun would:
LOCAL_RANK, NODE_RANK, MASTER_*) with bnps.lightning's plugin, the bnps job
from the BNPS_* environment. Writes <out>/rank<r>.pt: the trained network's
state_dict after the plugin's revert (plain BatchNorm layers) and, from rank
0, <out>/trained.ckpt, Lightning's own checkpoint written under the plugin.

    python lightning_worker.py OUT_DIR"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import bnps.lightning  # noqa: E402
import lightning_cases as cases  # noqa: E402


class Module(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = cases.net()

    def training_step(self, batch, index):
        return cases.loss(self.net, *batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=cases.LR)

    def train_dataloader(self):
        x, y = cases.data()
        mine = cases.rank_slice(self.trainer.global_rank)
        return DataLoader(TensorDataset(x[mine], y[mine]),
                          batch_size=cases.BATCH, shuffle=False)


def main(out):
    torch.set_num_threads(1)
    plugin = bnps.lightning.BnpsSyncBatchNorm()
    trainer = L.Trainer(
        accelerator="cpu", devices=cases.WORKERS,
        strategy=DDPStrategy(process_group_backend="gloo"),
        precision="64-true", max_steps=cases.STEPS, plugins=[plugin],
        use_distributed_sampler=False, logger=False,
        enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False)
    module = Module()
    trainer.fit(module)
    rank = trainer.global_rank
    trainer.save_checkpoint(os.path.join(out, "trained.ckpt"))
    plugin.revert(module)
    layers = [type(m).__name__ for m in module.net.modules()
              if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    torch.save({"state": module.net.state_dict(), "layers": layers},
               os.path.join(out, f"rank{rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1])
