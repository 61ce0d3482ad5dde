"""The model and data that ddp_test.py and ddp_worker.py share: a small
float64 conv net with two BatchNorm2d layers and a BatchNorm1d, a global
batch of 8 per step split evenly over 2 ranks."""

import torch

WORKERS = 2
BATCH = 8  # global, split evenly
STEPS = 4
LR = 0.2


def model():
    torch.manual_seed(5)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3), torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 6),
        torch.nn.BatchNorm1d(6), torch.nn.Linear(6, 3)).double()


def data(step):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(BATCH, 3, 6, 6, generator=g, dtype=torch.float64) * 2 + 1
    y = torch.randint(0, 3, (BATCH,), generator=g)
    return x, y


def rows(rank):
    per = BATCH // WORKERS
    return slice(rank * per, (rank + 1) * per)
