"""Per-channel tensor helpers shared by bnps.torch's layer paths: input of
shape (N, C, *), reduced over every dimension but the channels."""

import torch


def acc_dtype(dtype):
    """The dtype a layer accumulates in: float64 for float64 input, float32
    otherwise (16-bit input included)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def as_dtype(t, dtype):
    """t in `dtype`: t itself (or None) where it already is, without a call
    into torch (a layer pass makes several such conversions)."""
    return t if t is None or t.dtype == dtype else t.to(dtype)


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


def normalize(xa, mean, var, weight, bias, eps):
    """(x - mean) / sqrt(var + eps) * weight + bias per channel: torch's
    fused batch-norm kernel in inference form (F.batch_norm's call, less
    its Python-level checks; weight and bias may be None)."""
    return torch.batch_norm(xa, weight, bias, mean, var, False, 0.0, eps,
                            torch.backends.cudnn.enabled)


# The overload itself: calling the packet resolves it on every call.
_BN_BACKWARD = torch.ops.aten.native_batch_norm_backward.default


def backward_sums(xa, dya, mean, invstd, ones, eps):
    """(sum(dy), sum(dy * x_hat)) per channel of the normalization with
    `mean` and `invstd`: torch's fused reduction, zeros for empty input.
    `ones`: a weight of ones, not None (CUDA's reduction allocates
    grad_weight with the weight's options, "tensor does not have a device"
    for None); its values do not enter the two sums."""
    if xa.numel() == 0:
        zeros = torch.zeros(xa.shape[1], dtype=xa.dtype, device=xa.device)
        return zeros, zeros.clone()
    _, sum_dy_xhat, sum_dy = _BN_BACKWARD(
        dya, xa, ones, None, None, mean, invstd, True, eps,
        [False, True, True])
    return sum_dy, sum_dy_xhat


def input_gradient(k, xa, dya, dtype):
    """dx = k1 dy + k2 x + k3 per channel (k: 3 x C on xa's device, in its
    dtype), as `dtype`: two fused multiply-adds."""
    k0, k1, k2 = k.view([3] + channel_shape(xa)).unbind(0)
    dx = torch.addcmul(k2, xa, k1)
    dx.addcmul_(dya, k0)
    return as_dtype(dx, dtype)


def parameter_gradients(weight, sum_dy, sum_dy_xhat):
    """(dweight, dbias): the two sums in the weight's dtype; Nones without
    a weight."""
    if weight is None:
        return None, None
    return as_dtype(sum_dy_xhat, weight.dtype), as_dtype(sum_dy, weight.dtype)
