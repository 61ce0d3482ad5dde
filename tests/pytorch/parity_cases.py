"""The parity cases of pytorch_parity_test.py, shared by the test (which
computes torch.nn.BatchNorm on the concatenated batch in float64) and
parity_worker.py (which runs bnps.torch.SyncBatchNorm on its slice).

Every case's data is a pure function of (case, step): the global batch X and
the output gradient G, float64, from a seeded generator; worker w takes rows
[offset(w), offset(w) + sizes[w]) of both. The loss of worker w is
sum(y_w * G_w), so the global loss is the sum over workers and each worker's
input gradient is a slice of the global one.
"""

import torch
from torch import nn


class Case:
    def __init__(self, name, sizes, features, spatial=(4, 4), dtype="float64",
                 affine=True, steps=3, channels_last=False, track=True,
                 seed=0):
        self.name = name
        self.sizes = list(sizes)      # batch size of each worker
        self.features = features
        self.spatial = tuple(spatial)  # () for 2-D input
        self.dtype = getattr(torch, dtype)
        self.affine = affine
        self.steps = steps
        self.channels_last = channels_last
        self.track = track
        self.seed = seed

    def global_data(self, step):
        g = torch.Generator().manual_seed(1000 * self.seed + step)
        shape = (sum(self.sizes), self.features) + self.spatial
        # A large mean and a small spread per channel: float32 sum / sum of
        # squares would lose the variance; Chan's merge must not.
        scale = torch.rand(self.features, generator=g, dtype=torch.float64) + 0.5
        shift = 3 * torch.randn(self.features, generator=g, dtype=torch.float64)
        view = [1, self.features] + [1] * len(self.spatial)
        x = torch.randn(shape, generator=g, dtype=torch.float64) * \
            scale.view(view) + shift.view(view)
        dy = torch.randn(shape, generator=g, dtype=torch.float64)
        return x, dy

    def slice(self, worker):
        start = sum(self.sizes[:worker])
        return slice(start, start + self.sizes[worker])

    def init_params(self):
        g = torch.Generator().manual_seed(7 + self.seed)
        w = 1 + 0.5 * torch.randn(self.features, generator=g, dtype=torch.float64)
        b = 0.5 * torch.randn(self.features, generator=g, dtype=torch.float64)
        return w, b


# Run together on one 3-worker sync cluster (each case is its own layer).
SYNC3 = [
    Case("basic", [4, 4, 4], 5, steps=6, seed=1),
    Case("uneven_empty", [5, 0, 3], 4, steps=4, seed=2),
    Case("one_sample", [1, 1, 1], 3, steps=3, seed=3),
    # One value per channel and worker: 2-D input, a batch of one each.
    Case("one_sample_2d", [1, 1, 1], 5, spatial=(), steps=3, seed=15),
    Case("no_affine", [2, 3, 1], 3, affine=False, steps=3, seed=4),
    Case("input_2d", [6, 2, 5], 7, spatial=(), steps=3, seed=5),
    Case("input_3d", [3, 3, 2], 4, spatial=(5,), steps=2, seed=6),
    Case("input_5d", [2, 1, 2], 3, spatial=(2, 3, 2), steps=2, seed=7),
    Case("channels_last", [3, 2, 3], 6, dtype="float32", channels_last=True,
         steps=3, seed=8),
    # Contiguous float32 on the CPU: the native layer steps (the C++
    # worker's kernels), also with an empty batch and 2-D input.
    Case("float32", [4, 0, 3], 4, dtype="float32", steps=3, seed=16),
    Case("float32_2d_no_affine", [5, 2, 4], 6, spatial=(), dtype="float32",
         affine=False, steps=3, seed=17),
    Case("half", [4, 3, 5], 4, dtype="float16", steps=3, seed=9),
    Case("bfloat16", [4, 3, 5], 4, dtype="bfloat16", steps=2, seed=10),
    Case("untracked", [3, 3, 2], 3, track=False, steps=2, seed=11),
]

# One layer applied to two batches per step (a siamese model): its backward
# passes run in the reverse order of its forwards.
SHARED = Case("shared", [3, 2], 3, steps=3, seed=14)


def shared_data(step):
    """(x1, dy1, x2, dy2) of SHARED's step: two global batches."""
    return SHARED.global_data(step) + SHARED.global_data(100 + step)


# Many steps: the running statistics after them.
LONG = Case("long", [3, 5], 4, steps=40, seed=12)

# Eval mode after training: inputs for it.
def eval_data(case):
    g = torch.Generator().manual_seed(99)
    shape = (sum(case.sizes), case.features) + case.spatial
    return torch.randn(shape, generator=g, dtype=torch.float64) + 1.0


# convert_sync_batchnorm on a model with nested modules (3 workers).
class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(x + self.bn(self.conv(x)))


class Nested(nn.Module):
    """BN at three depths, 2-D and 1-D, one without running statistics."""

    def __init__(self, c=4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1),
                                  nn.BatchNorm2d(c), nn.ReLU())
        self.blocks = nn.Sequential(Block(c), Block(c))
        self.head = nn.Sequential(nn.Linear(c, 6), nn.BatchNorm1d(6),
                                  nn.Linear(6, 5),
                                  nn.BatchNorm1d(5, track_running_stats=False))

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(x.mean(dim=(2, 3)))


def nested_model():
    """The model both sides start from: seeded, float64, with state that
    differs from a fresh BatchNorm's (so convert must keep it)."""
    torch.manual_seed(5)
    model = Nested().double()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                if m.affine:
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.uniform_(-0.5, 0.5)
                if m.running_mean is not None:
                    m.running_mean.uniform_(-1, 1)
                    m.running_var.uniform_(0.5, 2)
                    m.num_batches_tracked.fill_(3)
    return model


CONVERT_SIZES = [3, 2, 4]
CONVERT_STEPS = 3


def convert_data(step):
    g = torch.Generator().manual_seed(500 + step)
    n = sum(CONVERT_SIZES)
    return (torch.randn(n, 3, 5, 5, generator=g, dtype=torch.float64),
            torch.randn(n, 5, generator=g, dtype=torch.float64))


# ParameterServerOptimizer: a small model trained by 2 workers with uneven
# batches, against torch.optim.SGD on the global batch.
OPT_SIZES = [3, 5]
OPT_STEPS = 4
OPT_LR = 0.1
OPT_MOMENTUM = 0.9


def opt_model():
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(),
                         nn.Linear(6, 3))


def opt_data(step):
    g = torch.Generator().manual_seed(700 + step)
    n = sum(OPT_SIZES)
    return (torch.randn(n, 4, generator=g),
            torch.randint(0, 3, (n,), generator=g))
