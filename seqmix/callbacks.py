"""Keeping work from being lost: last.ckpt after every epoch, every N updates and at the end, and a checkpoint when a
run dies."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint

from seqmix.errors import SeqmixError
from seqmix.tasks.base import weights_finite

log = logging.getLogger("seqmix")


def _checkpoint_dir(trainer: L.Trainer) -> Path | None:
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.dirpath:
            return Path(cb.dirpath)
    return None


class LastCheckpoint(Checkpoint):
    """last.ckpt after every training epoch (its validation included), every ``every_n_updates`` optimizer updates
    within epochs (0: never; WMT epochs are hours) and when training ends, mid-epoch too (max_steps, max_time);
    interrupted.ckpt when training dies (exception, Ctrl-C). A run killed outright (OOM killer, preemption) thus
    loses at most an epoch or ``every_n_updates`` updates, and resumes at the batch it stopped at (the loader's
    place is in the checkpoint: seqmix.data.resumable_loader). ModelCheckpoint's own last.ckpt is only rewritten
    when it saves a top-k checkpoint, i.e. when the best score improves. List it after the ModelCheckpoints (as
    conf/callbacks does): Lightning runs checkpoint callbacks last, in their order, so the saved state holds their
    view of this epoch's validation (ModelCheckpoint itself saves at the train epoch's end when validating every
    epoch)."""

    def __init__(self, last_name: str = "last.ckpt", interrupted_name: str = "interrupted.ckpt",
                 every_n_updates: int = 0) -> None:
        if every_n_updates < 0:
            raise SeqmixError(f"every_n_updates={every_n_updates} must be >= 0 (0: only at epoch ends)")
        self.last_name = last_name
        self.interrupted_name = interrupted_name
        self.every_n_updates = every_n_updates
        self.last_path = ""  # where last.ckpt was written, once it was
        self.interrupted_path = ""  # where interrupted.ckpt was written, once it was
        self._saved_step = -1

    def _save_last(self, trainer: L.Trainer) -> None:
        directory = _checkpoint_dir(trainer)
        # fast_dev_run saves nothing, as Lightning's own ModelCheckpoint does under it
        if directory is not None and trainer.global_step > 0 and not trainer.sanity_checking \
                and not trainer.fast_dev_run:
            trainer.save_checkpoint(directory / self.last_name)
            self.last_path = str(directory / self.last_name)
            self._saved_step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        step = trainer.global_step  # unchanged over the batches one update accumulates: saved once
        if self.every_n_updates and step % self.every_n_updates == 0 and step != self._saved_step:
            self._save_last(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save_last(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save_last(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        directory = _checkpoint_dir(trainer)
        if directory is None or trainer.global_step == 0:
            return
        if not weights_finite(pl_module):
            log.warning("weights are not finite: not writing %s", self.interrupted_name)
            return
        path = directory / self.interrupted_name
        try:
            trainer.save_checkpoint(path)
        except (OSError, SeqmixError) as err:  # e.g. the full disk that stopped the run: report the first error
            log.warning("could not write %s: %s", path, err)
            return
        self.interrupted_path = str(path)
        log.warning("training stopped by %s; state saved to %s (resume with ckpt_path=%s)",
                    type(exception).__name__, path, path)
