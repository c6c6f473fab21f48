"""Naive TaLK written from the integral form (Lioutas & Guo 2020, Eq. 4–6), independent of prefix sums.

y[b, i, c] = (1/K) Σ_j x[b, j, c] · |[j, j+1) ∩ [start_i, end_i)|, K = l_max + r_max + 1,
start_i = clamp(i − left[b,i,h]·l_max, 0, T−1), end_i = clamp(i + right[b,i,h]·r_max, 0, T−1) + 1
(decoder: end_i = i + 1), h = c // (C // H).
"""

from __future__ import annotations

import torch


def talk_reference(x: torch.Tensor, left: torch.Tensor, right: torch.Tensor | None, l_max: int,
                   r_max: int) -> torch.Tensor:
    """Computes in float64 when given float64 tensors (differentiable in x, left and right)."""
    B, T, C = x.shape
    H = left.size(-1)
    pos = torch.arange(T, dtype=left.dtype).view(1, T, 1)
    start = (pos - left * l_max).clamp(0, T - 1)
    end = (pos + 1).expand_as(start) if right is None else (pos + right * r_max).clamp(0, T - 1) + 1
    bins = torch.arange(T, dtype=left.dtype)
    # overlap[b, i, h, j] of the unit bin j with the window of output i
    overlap = (torch.minimum(bins + 1, end[..., None]) - torch.maximum(bins, start[..., None])).clamp(min=0)
    y = torch.einsum("bihj,bjhd->bihd", overlap, x.view(B, T, H, C // H).to(overlap.dtype))
    return y.reshape(B, T, C) / (l_max + r_max + 1)


def talk_reference_grads(x, left, right, l_max, r_max, grad_out):
    """(y, dx, dleft, dright) in float64 via autograd on the reference (dright is None for the decoder)."""
    x64 = x.detach().double().requires_grad_(True)
    l64 = left.detach().double().requires_grad_(True)
    r64 = None if right is None else right.detach().double().requires_grad_(True)
    y = talk_reference(x64, l64, r64, l_max, r_max)
    inputs = (x64, l64) if r64 is None else (x64, l64, r64)
    grads = torch.autograd.grad(y, inputs, grad_out.double())
    return (y.detach(), *grads) if r64 is not None else (y.detach(), *grads, None)
