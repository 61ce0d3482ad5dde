"""The job lightning_test runs, shared by the test (its one-process
reference) and each Lightning rank (lightning_worker.py): a small float64
network with two BatchNorm layers, STEPS SGD steps of a squared error on
global batches of WORKERS * BATCH examples, rank r training on the r-th
slice of each."""

import torch
from torch import nn

WORKERS, STEPS, BATCH, LR = 2, 4, 6, 0.1


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 36, 5),
                         nn.BatchNorm1d(5)).double()


def data(workers=WORKERS):
    """(x, y) of every step's global batch of `workers` x BATCH, in order."""
    g = torch.Generator().manual_seed(3)
    n = STEPS * workers * BATCH
    return (torch.randn(n, 3, 8, 8, generator=g, dtype=torch.float64),
            torch.randn(n, 5, generator=g, dtype=torch.float64))


def rank_slice(rank, workers=WORKERS):
    """The indices rank `rank` of `workers` trains on, step after step."""
    return [k * workers * BATCH + rank * BATCH + i
            for k in range(STEPS) for i in range(BATCH)]


def loss(model, x, y):
    return ((model(x) - y) ** 2).mean()


def reference(workers=WORKERS):
    """One process, torch's BatchNorm on each global batch of `workers`
    ranks: the state_dict after STEPS steps (DDP averages the ranks'
    gradients of their means, which is the gradient of the global batch's
    mean)."""
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = data(workers)
    step = workers * BATCH
    for k in range(STEPS):
        opt.zero_grad()
        loss(model, x[k * step:(k + 1) * step],
             y[k * step:(k + 1) * step]).backward()
        opt.step()
    return model.state_dict()
