"""A tiny model trained with PyTorch Lightning under DDP (gloo, CPU), its
BatchNorm layers synchronized through bnps by the plugin
bnps.lightning.BnpsSyncBatchNorm. Servers: a bnps.cluster.LocalCluster on
127.0.0.1 that this script starts (the parent process, before Lightning
starts its workers), so it runs on one machine with no set-up:

    pip install lightning   # plus torch and the bnps wheel
    python examples/pytorch/lightning_train.py --devices=2

In a real job, start the servers yourself and set BNPS_SERVERS (or pass
start_local_server=True to the plugin, which bnps.torch.init takes); the
plugin reads the worker id from the variables Lightning's launcher sets."""

import argparse
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import bnps.lightning
from bnps.cluster import LocalCluster
import lightning.pytorch as pl


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8),
                                 nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(8, 2))

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    cluster = None
    if "BNPS_SERVERS" not in os.environ:  # the launching process only
        cluster = LocalCluster(num_servers=1, num_workers=args.devices).start()
        os.environ["BNPS_SERVERS"] = cluster.servers
    try:
        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64 * args.devices, 3, 8, 8),
                             torch.randint(0, 2, (64 * args.devices,)))
        trainer = pl.Trainer(
            accelerator="cpu", devices=args.devices, strategy="ddp",
            plugins=[bnps.lightning.BnpsSyncBatchNorm()],
            max_steps=args.steps, logger=False, enable_checkpointing=False,
            enable_progress_bar=False)
        trainer.fit(Tiny(), DataLoader(data, batch_size=16))
        if trainer.global_rank == 0:
            print("trained", trainer.global_step, "steps")
    finally:
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()
