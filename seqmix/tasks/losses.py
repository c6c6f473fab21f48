"""Label-smoothed cross-entropy with fairseq's formula."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_nll_loss(logits: Tensor, target: Tensor, epsilon: float, ignore_index: int
                            ) -> tuple[Tensor, Tensor, int]:
    """Summed (loss, nll) over non-pad targets, and their count.

    fairseq: loss = (1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v), eps_i = eps / (V - 1).
    Log-probabilities are computed in fp32 whatever the autocast dtype.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1)
    target = target.unsqueeze(-1)
    nll = -lprobs.gather(dim=-1, index=target).squeeze(-1)
    smooth = -lprobs.sum(dim=-1)
    keep = target.squeeze(-1).ne(ignore_index)
    nll = nll.masked_fill(~keep, 0.0).sum()
    smooth = smooth.masked_fill(~keep, 0.0).sum()
    eps_i = epsilon / (lprobs.size(-1) - 1)
    loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
    return loss, nll, int(keep.sum())


