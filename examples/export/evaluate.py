"""Evaluates a bnps export in PyTorch: the built-in CNN of bnps_worker
(nn/model.h) as the equivalent torch.nn module, its trained
parameters and BN running statistics loaded from the safetensors file that
`bnps_status --export` (or bnps.export.export, or the launcher's --export)
wrote, with load_state_dict(strict=True), then Fashion-MNIST's test set.

    bnps_status --servers=127.0.0.1:7000,127.0.0.1:7001 --export=model.safetensors
    tools/bnps_python examples/export/evaluate.py model.safetensors --width=16

prints `test accuracy 0.8831 (10000 examples)`: the accuracy bnps_worker
printed for the same parameters, to float rounding. --width, --depth and
--model must be the workers' (their defaults are bnps_worker's).
"""

import argparse
import gzip
import os
import struct
import sys

import torch
from torch import nn

import bnps.export

DATA_DIR = "/usr/share/datasets/fashion-mnist"
# bnps_worker's normalization (worker/data/batcher.h).
MEAN, STD = 0.2860, 0.3530


class Block(nn.Module):
    """A residual block: conv1 - bn1 - ReLU - conv2 - bn2, + input, ReLU."""

    def __init__(self, c):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def conv_bn(c_in, c_out, stride):
    """conv3x3 - BN (- ReLU in forward): named conv and bn, as the worker's."""
    return nn.ModuleDict({"conv": nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False),
                          "bn": nn.BatchNorm2d(c_out)})


class BnpsCnn(nn.Module):
    """bnps_worker --model=cnn (or deep): module names are the worker's keys
    with PyTorch's parameter names, so an export loads with strict=True."""

    def __init__(self, width=16, depth=1, classes=10, deep=False, in_channels=1):
        super().__init__()
        w = width
        self.stem = conv_bn(in_channels, w, 1)
        stages = [("", "stage1", w, w), ("down", "stage2", w, 2 * w)]
        if deep:
            stages += [("down2", "stage3", 2 * w, 4 * w),
                       ("down3", "stage4", 4 * w, 4 * w)]
        self.order = []
        for down, stage, c_in, c_out in stages:
            if down:
                setattr(self, down, conv_bn(c_in, c_out, 2))
                self.order.append(down)
            setattr(self, stage, nn.ModuleDict(
                {f"block{i}": Block(c_out) for i in range(depth)}))
            self.order.append(stage)
        self.head = nn.ModuleDict({"fc": nn.Linear(stages[-1][3], classes)})

    def forward(self, x):
        x = torch.relu(self.stem["bn"](self.stem["conv"](x)))
        x = nn.functional.max_pool2d(x, 2, 2)
        for name in self.order:
            part = getattr(self, name)
            if "conv" in part:
                x = torch.relu(part["bn"](part["conv"](x)))
            else:
                for block in part.values():
                    x = block(x)
        return self.head["fc"](x.mean(dim=(2, 3)))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]),
                            dtype=torch.uint8).reshape(shape)


def test_set(limit=0, data_dir=DATA_DIR):
    """(images [N, 1, 28, 28] float32 normalized as the worker's, labels);
    the first `limit` examples (0: all), as bnps_worker's --test_examples."""
    images = read_idx(os.path.join(data_dir, "t10k-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz"))
    if limit > 0:
        images, labels = images[:limit], labels[:limit]
    x = (images.to(torch.float32) / 255.0 - MEAN) / STD
    return x.unsqueeze(1), labels.to(torch.int64)


def load_model(path, width=16, depth=1, deep=False):
    model = BnpsCnn(width=width, depth=depth, deep=deep)
    model.load_state_dict(bnps.export.load(path), strict=True)
    return model.eval()


@torch.no_grad()
def accuracy(model, images, labels, batch=500):
    correct = 0
    for i in range(0, len(labels), batch):
        logits = model(images[i:i + batch])
        correct += int((logits.argmax(dim=1) == labels[i:i + batch]).sum())
    return correct / len(labels)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("export", help="the safetensors file of the export")
    p.add_argument("--width", type=int, default=16, help="bnps_worker --width")
    p.add_argument("--depth", type=int, default=1, help="bnps_worker --depth")
    p.add_argument("--model", choices=["cnn", "deep"], default="cnn",
                   help="bnps_worker --model")
    p.add_argument("--test_examples", type=int, default=0,
                   help="the first N test examples (0: all 10000)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model = load_model(args.export, args.width, args.depth, args.model == "deep")
    images, labels = test_set(args.test_examples)
    print("test accuracy %.4f (%d examples)" % (accuracy(model, images, labels),
                                                len(labels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
