"""A small ResNet-style CNN for 28x28 grayscale images (the shape of bnps's
built-in model, nn/model.h) and Fashion-MNIST from its IDX files, for
the example and the benchmark. Plain PyTorch: nn.BatchNorm2d everywhere, so
that bnps.torch.convert_sync_batchnorm is the one-line switch."""

import gzip
import os
import struct

import torch
from torch import nn

DATA_DIR = "/usr/share/datasets/fashion-mnist"  # tools/setup.sh installs it
MEAN, STD = 0.2860, 0.3530  # of the training images' pixels / 255


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class SmallResNet(nn.Module):
    """stem conv-BN-ReLU-maxpool, `depth` blocks of `width`, a strided
    conv-BN-ReLU to 2 width, `depth` blocks, global average pool, linear."""

    def __init__(self, width=16, depth=1, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.stage1 = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.down = nn.Sequential(
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(2 * width), nn.ReLU())
        self.stage2 = nn.Sequential(*[Block(2 * width) for _ in range(depth)])
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.stage2(self.down(self.stage1(self.stem(x))))
        return self.head(x.mean(dim=(2, 3)))


def _idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]),
                            dtype=torch.uint8).view(*shape)


def fashion_mnist(split, limit=None, data_dir=DATA_DIR):
    """(images float32 (N, 1, 28, 28) normalized, labels int64 (N,)) of
    "train" or "test", the first `limit` examples."""
    prefix = "train" if split == "train" else "t10k"
    images = _idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = _idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    if limit is not None:
        images, labels = images[:limit], labels[:limit]
    x = (images.float() / 255.0 - MEAN) / STD
    return x.unsqueeze(1), labels.long()
