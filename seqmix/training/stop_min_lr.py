"""End training once the learning rate has been annealed down to a floor (``stop_min_lr``; 0 = off).

The ConvS2S recipe (Gehring et al. 2017 §4.2) multiplies the lr by 0.1 whenever validation stops improving;
fairseq ran that loop until the lr fell to its minimum (``--min-lr`` 1e-5 in the fairseq-py of the paper,
``--stop-min-lr`` today), so the number of non-improving validations, not an epoch budget, ends the run.
Like fairseq this stops at lr <= stop_min_lr: ReduceLROnPlateau clamps the lr *at* its own ``min_lr``, so with
both set to the same floor a strict ``<`` would never fire. The comparison allows float rounding (1e-6
relative): 0.25·0.1·0.1 is 0.0025000000000000005, which the scheduler then leaves alone at a 0.0025 floor (the
change would be below its eps), so an exact ``<=`` 0.0025 would never fire either.
"""

from __future__ import annotations

import logging

import lightning as L

from seqmix.errors import SeqmixError

log = logging.getLogger("seqmix")
_ROUNDING = 1e-6


class StopAtMinLR(L.Callback):
    def __init__(self, min_lr: float = 0.0) -> None:
        if min_lr < 0:
            raise SeqmixError(f"stop_min_lr must be >= 0 (0 = off), got {min_lr}")
        self.min_lr = float(min_lr)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Lightning steps epoch-interval schedulers (reduce_on_plateau) after the epoch's validation and after
        every epoch-end hook, so the next epoch's start is the first hook that sees the annealed lr. Stopping
        here runs no batch; the checkpoints of that validation are already written (and LastCheckpoint refreshes
        last.ckpt at the end)."""
        if self.min_lr <= 0:
            return
        lrs = [group["lr"] for opt in trainer.optimizers for group in opt.param_groups]
        stop = bool(lrs) and max(lrs) <= self.min_lr * (1 + _ROUNDING)
        if trainer.strategy.reduce_boolean_decision(stop, all=False):  # every rank stops together
            trainer.should_stop = True
            if trainer.is_global_zero:
                log.info("stopping after epoch %d: learning rate %.3g reached stop_min_lr=%g",
                         trainer.current_epoch, max(lrs), self.min_lr)
