"""Naive ConvS2S decoder step written from the formula (independent of the kernel; float64-capable).

New step i of row b sees the window inputs i .. i+k−1 (the last k−1 inputs before it, then itself):
    h[b, i, :] = bias + Σ_j weight[:, j·C_in : (j+1)·C_in] · window[b, i + j, :]      (2·C_out values)
    y[b, i, o] = h[b, i, o] · σ(h[b, i, C_out + o])                                  (GLU, Dauphin et al. 2017)
    y ← (y + residual)·√0.5 when a residual is given                                 (Gehring et al. 2017 §3.2)
"""

from __future__ import annotations

import math

import torch


def convs2s_step_reference(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                           residual: torch.Tensor | None = None) -> torch.Tensor:
    """window (B, W, C_in), weight (2·C_out, k·C_in), bias (2·C_out,), residual (B, W−k+1, C_out) or None.
    Computes in the promoted dtype of the inputs; pass float64 tensors for a ground truth."""
    B, W, C_in = window.shape
    k = weight.shape[1] // C_in
    n = W - k + 1
    h = bias.to(torch.promote_types(window.dtype, weight.dtype)).expand(B, n, -1).clone()
    for j in range(k):
        h = h + window[:, j: j + n] @ weight[:, j * C_in: (j + 1) * C_in].T
    value, gate = h.chunk(2, dim=-1)
    y = value * torch.sigmoid(gate)
    return y if residual is None else (y + residual) * math.sqrt(0.5)


def convs2s_step_reference_grads(window, weight, bias, residual, grad_out):
    """(y, dwindow, dweight, dbias, dresidual) in float64 via autograd on the reference (dresidual None
    without a residual)."""
    leaves = [t.detach().double().requires_grad_(True) for t in (window, weight, bias)]
    res = None if residual is None else residual.detach().double().requires_grad_(True)
    y = convs2s_step_reference(*leaves, res)
    grads = torch.autograd.grad(y, leaves + ([res] if res is not None else []), grad_out.double())
    return (y.detach(), *grads[:3], grads[3] if res is not None else None)
