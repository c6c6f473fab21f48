"""Random training contexts of the non-autoregressive models, drawn for a whole batch at once on tensors.

Targets are right-padded rows of real tokens followed by eos. "Real" below means neither pad nor eos. Choosing
k of a row's eligible positions uniformly = ranking i.i.d. uniform scores and keeping the k smallest ranks.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _ranks(scores: Tensor) -> Tensor:
    """Rank of every element along the last dimension (0 = smallest)."""
    return scores.argsort(dim=-1).argsort(dim=-1)


def real_positions(target: Tensor, pad: int, eos: int) -> Tensor:
    return target.ne(pad) & target.ne(eos)


def disco_observed(target: Tensor, pad: int, eos: int, generator: torch.Generator | None = None) -> Tensor:
    """DisCo's observed sets (B, T, T): ``[b, n, m]`` True when query n sees token m.

    For every query independently: a count k uniform in {0 .. N-2} (N = real tokens + eos), then k of the
    other real tokens chosen uniformly; never itself or a pad; eos always visible.
    """
    b, t = target.shape
    real = real_positions(target, pad, eos)
    others = real.sum(dim=1, keepdim=True)  # N - 1: the real tokens a real query may choose from, plus itself
    u = torch.rand(b, t, generator=generator, device=target.device)
    k = (u * others).floor().long()  # uniform in {0 .. N-2}
    eye = torch.eye(t, dtype=torch.bool, device=target.device)
    eligible = real.unsqueeze(1) & ~eye  # (B, T, T)
    scores = torch.rand(b, t, t, generator=generator, device=target.device).masked_fill(~eligible, 2.0)
    observed = (_ranks(scores) < k.unsqueeze(-1)) & eligible
    return observed | target.eq(eos).unsqueeze(1)


def cmlm_masked(target: Tensor, pad: int, eos: int, generator: torch.Generator | None = None) -> Tensor:
    """CMLM's masked positions (B, T): a count uniform in {1 .. real tokens}, positions chosen uniformly among
    the real tokens (eos and pads are never masked)."""
    b, t = target.shape
    real = real_positions(target, pad, eos)
    n = real.sum(dim=1, keepdim=True)
    u = torch.rand(b, 1, generator=generator, device=target.device)
    m = (u * n).floor().long() + 1  # uniform in {1 .. n}
    scores = torch.rand(b, t, generator=generator, device=target.device).masked_fill(~real, 2.0)
    return (_ranks(scores) < m) & real
