"""Label-smoothed cross-entropy with fairseq's formula."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def loss_dtype(*tensors: Tensor) -> torch.dtype:
    """fp32 for half-precision (autocast) inputs, else the inputs' own dtype (float64 stays float64)."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def smoothing_weights(epsilon: float, vocab_size: int) -> tuple[float, float]:
    """(weight of the nll, eps_i): loss = (1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v)."""
    eps_i = epsilon / (vocab_size - 1)
    return 1.0 - epsilon - eps_i, eps_i


def label_smoothed_nll_loss(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int,
                            ntokens: int | None = None) -> tuple[Tensor, Tensor, int]:
    """Summed (loss, nll) over non-pad targets, and their count (``ntokens`` when the caller knows it: counting
    on the device would make the host wait for it every update).

    fairseq: loss = (1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v), eps_i = eps / (V - 1).
    Log-probabilities are computed in fp32 (or float64 for float64 logits) whatever the autocast dtype.
    """
    lprobs = F.log_softmax(logits.to(loss_dtype(logits)), dim=-1)
    target = target.unsqueeze(-1)
    nll = -lprobs.gather(dim=-1, index=target).squeeze(-1)
    smooth = -lprobs.sum(dim=-1)
    keep = target.squeeze(-1).ne(ignore_index)
    nll = nll.masked_fill(~keep, 0.0).sum()
    smooth = smooth.masked_fill(~keep, 0.0).sum()
    nll_weight, eps_i = smoothing_weights(epsilon, lprobs.size(-1))
    loss = nll_weight * nll + eps_i * smooth
    return loss, nll, int(keep.sum()) if ntokens is None else ntokens


