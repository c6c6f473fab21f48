"""Learning-rate schedules as LambdaLR multipliers of the optimizer's peak lr (stepped per update), and a
metric-driven one (``reduce_on_plateau``, stepped after each validation)."""

from __future__ import annotations

import math

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau


def inverse_sqrt(optimizer: Optimizer, warmup_updates: int = 4000, warmup_init_lr: float = 1e-7) -> LambdaLR:
    """fairseq's inverse_sqrt: linear warmup from ``warmup_init_lr`` to lr, then lr * sqrt(warmup / step)."""
    peak = optimizer.param_groups[0]["lr"]
    init = min(warmup_init_lr, peak) / peak

    def factor(step: int) -> float:
        if warmup_updates > 0 and step < warmup_updates:
            return init + (1.0 - init) * step / warmup_updates
        return math.sqrt(max(warmup_updates, 1) / max(step, 1))

    return LambdaLR(optimizer, factor)


def cosine(optimizer: Optimizer, total_updates: int, warmup_updates: int = 10000, warmup_init_lr: float = 1e-7,
           min_lr: float = 1e-9) -> LambdaLR:
    """Linear warmup, then half a cosine from lr down to ``min_lr`` at ``total_updates`` (Wu 2019 §5.3)."""
    peak = optimizer.param_groups[0]["lr"]
    init, floor = min(warmup_init_lr, peak) / peak, min(min_lr, peak) / peak

    def factor(step: int) -> float:
        if warmup_updates > 0 and step < warmup_updates:
            return init + (1.0 - init) * step / warmup_updates
        span = max(total_updates - warmup_updates, 1)
        progress = min((step - warmup_updates) / span, 1.0)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


def constant(optimizer: Optimizer, warmup_updates: int = 0, warmup_init_lr: float = 1e-7) -> LambdaLR:
    peak = optimizer.param_groups[0]["lr"]
    init = min(warmup_init_lr, peak) / peak
    return LambdaLR(optimizer, lambda s: init + (1 - init) * s / warmup_updates if s < warmup_updates else 1.0)


def reduce_on_plateau(optimizer: Optimizer, monitor: str = "val/nll", factor: float = 0.1, patience: int = 0,
                      threshold: float = 0.0, min_lr: float = 0.0) -> dict:
    """Multiply lr by ``factor`` after every validation whose ``monitor`` (lower is better) did not beat the
    best so far by more than ``threshold`` (Gehring et al. 2017 §4.2: ×0.1 once validation perplexity stops
    improving; fairseq's ``reduce_lr_on_plateau``). A validation metric only exists after a validation, so
    this returns a Lightning scheduler config (stepped per epoch, with the monitored key), not a scheduler.
    ``min_lr`` is a floor; ending the run there is ``stop_min_lr``'s job (``seqmix.training.stop_min_lr``).
    """
    scheduler = ReduceLROnPlateau(optimizer, mode="min", factor=factor, patience=patience, threshold=threshold,
                                  threshold_mode="abs", min_lr=min_lr)
    return {"scheduler": scheduler, "monitor": monitor, "interval": "epoch"}
