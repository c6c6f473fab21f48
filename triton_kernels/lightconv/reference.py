"""Naive LightConv written straight from the formula (independent of the kernels; float64-capable).

y[b, t, c] = sum_k w[h(c), k] * x[b, t + k - padding_l, c],  h(c) = c // (C // H), zero outside [0, T).
"""

from __future__ import annotations

import torch


def lightconv_reference(x: torch.Tensor, weight: torch.Tensor, padding_l: int) -> torch.Tensor:
    """Computes in the promoted dtype of x and weight; pass float64 tensors for a ground truth."""
    B, T, C = x.shape
    H, K = weight.shape
    w_per_channel = weight.repeat_interleave(C // H, dim=0)  # (C, K)
    y = x.new_zeros((B, T, C), dtype=torch.promote_types(x.dtype, weight.dtype))
    for k in range(K):
        shift = k - padding_l  # y[t] takes x[t + shift]
        lo, hi = max(0, -shift), min(T, T - shift)
        if lo < hi:
            y[:, lo:hi, :] = y[:, lo:hi, :] + x[:, lo + shift : hi + shift, :] * w_per_channel[:, k]
    return y


def lightconv_reference_grads(
    x: torch.Tensor, weight: torch.Tensor, padding_l: int, grad_out: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, dx, dw) in float64 via autograd on the reference."""
    x64 = x.detach().double().requires_grad_(True)
    w64 = weight.detach().double().requires_grad_(True)
    y = lightconv_reference(x64, w64, padding_l)
    dx, dw = torch.autograd.grad(y, (x64, w64), grad_out.double())
    return y.detach(), dx, dw
