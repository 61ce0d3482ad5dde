"""Per-channel tensor helpers shared by bnps.torch's layer paths: input of
shape (N, C, *), reduced over every dimension but the channels."""

import torch


def acc_dtype(dtype):
    """The dtype a layer accumulates in: float64 for float64 input, float32
    otherwise (16-bit input included)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def reduce_dims(x):
    return [0] + list(range(2, x.dim()))


def channel_shape(x):
    """A per-channel vector's shape broadcast against x."""
    return [1, x.shape[1]] + [1] * (x.dim() - 2)


def var_mean(xa, dims):
    """(biased variance, mean) over `dims`."""
    try:  # torch >= 2.0
        return torch.var_mean(xa, dim=dims, correction=0)
    except TypeError:  # torch 1.13
        return torch.var_mean(xa, dim=dims, unbiased=False)
