"""Output projection fused with label-smoothed cross-entropy, in row chunks.

The unfused loss builds (tokens x vocabulary) fp32 logits and keeps them, plus their log-softmax, for backward.
Here each chunk's logits live only while that chunk is reduced (forward) or differentiated (backward): the
saved state is the features, the weight and one log-sum-exp per token. Same formula as
``seqmix.tasks.losses.label_smoothed_nll_loss`` (fairseq's); pads are dropped before any projection.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from seqmix.kernel_backend import FUSED_LABEL_SMOOTHED_LOSS, triton_function
from seqmix.tasks.losses import loss_dtype, smoothing_weights

DEFAULT_CHUNK_ROWS = 256  # 256 x 8K fp32 logits = 8 MB: cache-sized (larger chunks were slower on CPU)


class _ProjectedLabelSmoothedLoss(torch.autograd.Function):
    """(loss_sum, nll_sum) of ``features @ weight.T`` against ``target``; every row is a scored token."""

    @staticmethod
    def forward(ctx, features: Tensor, weight: Tensor, target: Tensor, epsilon: float, chunk_rows: int):
        dtype = loss_dtype(features, weight)
        with torch.autocast(features.device.type, enabled=False):
            w = weight.to(dtype)
            vocab = w.size(0)
            lse = features.new_empty(features.size(0), dtype=dtype)
            nll = features.new_zeros((), dtype=dtype)
            smooth = features.new_zeros((), dtype=dtype)
            for start in range(0, features.size(0), chunk_rows):
                rows = slice(start, start + chunk_rows)
                logits = features[rows].to(dtype) @ w.t()
                chunk_lse = torch.logsumexp(logits, dim=-1)
                lse[rows] = chunk_lse
                nll += (chunk_lse - logits.gather(1, target[rows, None]).squeeze(1)).sum()
                smooth += (vocab * chunk_lse - logits.sum(dim=-1)).sum()
            nll_weight, eps_i = smoothing_weights(epsilon, vocab)
            loss = nll_weight * nll + eps_i * smooth
        ctx.save_for_backward(features, weight, target, lse)
        ctx.epsilon, ctx.chunk_rows = epsilon, chunk_rows
        return loss, nll

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor):
        """d/dlogits: loss -> softmax - (1-eps-eps_i) onehot - eps_i; nll -> softmax - onehot."""
        features, weight, target, lse = ctx.saved_tensors
        dtype = lse.dtype
        with torch.autocast(features.device.type, enabled=False):
            w = weight.to(dtype)
            nll_weight, eps_i = smoothing_weights(ctx.epsilon, w.size(0))
            g_loss, g_nll = grad_loss.to(dtype), grad_nll.to(dtype)
            scale_p, scale_target, shift = g_loss + g_nll, g_loss * nll_weight + g_nll, g_loss * eps_i
            grad_features = torch.empty_like(features) if ctx.needs_input_grad[0] else None
            grad_weight = torch.zeros_like(w) if ctx.needs_input_grad[1] else None
            for start in range(0, features.size(0), ctx.chunk_rows):
                rows = slice(start, start + ctx.chunk_rows)
                chunk = features[rows].to(dtype)
                grad = torch.exp(chunk @ w.t() - lse[rows, None]).mul_(scale_p).sub_(shift)
                grad.scatter_add_(1, target[rows, None], (-scale_target).expand(grad.size(0), 1))
                if grad_features is not None:
                    grad_features[rows] = (grad @ w).to(features.dtype)
                if grad_weight is not None:
                    grad_weight.addmm_(grad.t(), chunk)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_features, grad_weight, None, None, None


def projected_label_smoothed_loss(features: Tensor, weight: Tensor, target: Tensor, epsilon: float,
                                  ignore_index: int, chunk_rows: int = DEFAULT_CHUNK_ROWS,
                                  kernel_backend: str = "auto", ntokens: int | None = None
                                  ) -> tuple[Tensor, Tensor, int]:
    """``label_smoothed_nll_loss(features @ weight.T, ...)`` without the full logits.

    ``features``: (N, C) or (B, T, C); ``weight``: (V, C); ``target``: (N,) or (B, T). Returns summed
    (loss, nll) over non-pad targets and their count. CUDA tensors use the Triton kernel
    ``triton_kernels.fused_xent`` when it exists (``kernel_backend``: auto | triton | torch). ``ntokens``: the
    count when the caller knows it (the collated batch does), so the kernel path never waits for the device.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
    features = features.reshape(-1, features.size(-1))
    target = target.reshape(-1)
    keep = target.ne(ignore_index)
    scored = []  # the chunked path's row count (its nonzero() has read it back already)

    def chunked(features, weight, target, epsilon, ignore_index):
        rows = keep.nonzero().squeeze(1)
        scored.append(rows.numel())
        return _ProjectedLabelSmoothedLoss.apply(features.index_select(0, rows), weight,
                                                 target.index_select(0, rows), epsilon, chunk_rows)

    kernel = triton_function(kernel_backend, features, FUSED_LABEL_SMOOTHED_LOSS, fallback=chunked)
    if kernel is not None:
        loss, nll = kernel(features, weight, target, epsilon, ignore_index)
        return loss, nll, int(keep.sum()) if ntokens is None else ntokens
    loss, nll = chunked(features, weight, target, epsilon, ignore_index)
    return loss, nll, scored[-1]
