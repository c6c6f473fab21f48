"""Perplexity from a summed negative log-likelihood (nats) over a number of predicted tokens."""

from __future__ import annotations

import math


def perplexity(nll_sum: float, ntokens: int) -> float:
    """exp(mean NLL); inf when it overflows (a diverged model), nan for no tokens."""
    if ntokens <= 0:
        return math.nan
    mean = nll_sum / ntokens
    return math.exp(mean) if mean < 700 else math.inf
