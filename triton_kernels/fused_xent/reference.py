"""Naive fused-loss reference written from the formula (independent of the kernels; float64-capable).

logits = features @ weight.T,  log p_v = logits_v - log sum_u exp(logits_u),
per non-pad row: nll = -log p_target,  loss = (1 - eps - eps_i)·nll + eps_i·sum_v(-log p_v),  eps_i = eps/(V-1).
"""

from __future__ import annotations

import torch


def fused_loss_reference(features: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, epsilon: float,
                         ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss_sum, nll_sum) in the promoted dtype of features and weight; pass float64 for a ground truth."""
    logits = features @ weight.T
    log_p = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    keep = target != ignore_index
    rows = torch.arange(target.shape[0])[keep]
    nll = -log_p[rows, target[keep]]
    smooth = -log_p[keep].sum(dim=-1)
    eps_i = epsilon / (weight.shape[0] - 1)
    loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
    return loss.sum(), nll.sum()


def fused_loss_reference_grads(features, weight, target, epsilon, ignore_index, g_loss=1.0, g_nll=0.0):
    """(loss, nll, d features, d weight) in float64 for the objective g_loss·loss + g_nll·nll."""
    f64 = features.detach().double().requires_grad_(True)
    w64 = weight.detach().double().requires_grad_(True)
    loss, nll = fused_loss_reference(f64, w64, target, epsilon, ignore_index)
    df, dw = torch.autograd.grad(g_loss * loss + g_nll * nll, (f64, w64))
    return loss.detach(), nll.detach(), df, dw
