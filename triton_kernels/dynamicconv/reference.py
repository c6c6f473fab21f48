"""Naive DynamicConv written straight from the formula (independent of the kernels; float64-capable).

y[b, t, c] = sum_k w[b, t, h(c), k] * x[b, t + k - padding_l, c],  h(c) = c // (C // H),
x zero outside [0, T). Optional exact softmax over all K taps for callers that want it.
"""

from __future__ import annotations

import torch


def dynamicconv_reference(
    x: torch.Tensor, weight: torch.Tensor, padding_l: int, softmax: bool = False
) -> torch.Tensor:
    """Computes in the promoted dtype of x and weight; pass float64 tensors for a ground truth."""
    B, T, C = x.shape
    H, K = weight.shape[2], weight.shape[3]
    if softmax:
        weight = torch.softmax(weight, dim=-1)  # over all K taps, even when T < K
    w_per_channel = weight.repeat_interleave(C // H, dim=2)  # (B, T, C, K)
    y = x.new_zeros((B, T, C), dtype=torch.promote_types(x.dtype, weight.dtype))
    for k in range(K):
        shift = k - padding_l
        lo, hi = max(0, -shift), min(T, T - shift)
        if lo < hi:
            y[:, lo:hi, :] = y[:, lo:hi, :] + x[:, lo + shift : hi + shift, :] * w_per_channel[:, lo:hi, :, k]
    return y


def dynamicconv_reference_grads(
    x: torch.Tensor, weight: torch.Tensor, padding_l: int, grad_out: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, dx, dw) in float64 via autograd on the reference."""
    x64 = x.detach().double().requires_grad_(True)
    w64 = weight.detach().double().requires_grad_(True)
    y = dynamicconv_reference(x64, w64, padding_l)
    dx, dw = torch.autograd.grad(y, (x64, w64), grad_out.double())
    return y.detach(), dx, dw
