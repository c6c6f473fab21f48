"""Callbacks that keep work from being lost: a final last.ckpt, and a checkpoint when a run dies."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

log = logging.getLogger("seqmix")


def _checkpoint_dir(trainer: L.Trainer) -> Path | None:
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.dirpath:
            return Path(cb.dirpath)
    return None


class SaveOnStop(L.Callback):
    """ModelCheckpoint saves at epoch/validation ends only: when max_steps or max_time stops training
    mid-epoch, refresh last.ckpt; when training dies (exception, Ctrl-C), write interrupted.ckpt."""

    def __init__(self, last_name: str = "last.ckpt", interrupted_name: str = "interrupted.ckpt") -> None:
        self.last_name = last_name
        self.interrupted_name = interrupted_name

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        directory = _checkpoint_dir(trainer)
        if directory is not None and trainer.global_step > 0:
            trainer.save_checkpoint(directory / self.last_name)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        directory = _checkpoint_dir(trainer)
        if directory is None or trainer.global_step == 0:
            return
        if not all(torch.isfinite(p).all() for p in pl_module.parameters()):
            log.warning("weights are not finite: not writing %s", self.interrupted_name)
            return
        path = directory / self.interrupted_name
        trainer.save_checkpoint(path)
        log.warning("training stopped by %s; state saved to %s (resume with ckpt_path=%s)",
                    type(exception).__name__, path, path)
