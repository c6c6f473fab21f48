"""The training progress bar without a host sync per update.

A tensor logged with ``prog_bar=True`` is converted to a Python number by Lightning itself after every training
batch (``_LoggerConnector.on_batch_end``), whatever bar is used; on a GPU each conversion waits for the queued
update to finish. So the training loss is logged without ``prog_bar`` (``SeqmixTask.training_step``) and this bar
reads the metrics it shows (``show``) from ``trainer.callback_metrics`` itself: every update on CPU, where a read
costs nothing, every ``metrics_interval`` updates elsewhere and at an epoch's last batch, showing the last values
read in between. Batch counts and speed still move every batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from torch import Tensor

from seqmix.errors import SeqmixError
from seqmix.layers.host_reads import read_interval


class ProgressBar(RichProgressBar):
    def __init__(self, show: Sequence[str] = ("train/loss",), metrics_interval: int | None = None,
                 **kwargs: Any) -> None:
        """``show``: logged training metrics to display; ``metrics_interval``: updates between reads of them (None:
        1 on CPU, 50 on other devices)."""
        super().__init__(**kwargs)
        if metrics_interval is not None and metrics_interval < 1:
            raise SeqmixError(f"metrics_interval must be >= 1 or null, got {metrics_interval}")
        self.show = tuple(show)
        self.metrics_interval = metrics_interval
        self._shown: dict[str, float] = {}
        self._read_at: int | None = None

    def _interval(self, pl_module: L.LightningModule) -> int:
        return read_interval(self.metrics_interval, pl_module.device)

    def _reads_now(self, trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
        """During training: at the first batch, an epoch's last batch and every interval-th update."""
        if self._read_at is None:
            return True
        step = trainer.global_step
        if step == self._read_at:  # read at this update already (gradient accumulation: several batches)
            return False
        return trainer.fit_loop.epoch_loop.batch_progress.is_last_batch or step % self._interval(pl_module) == 0

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        metrics = super().get_metrics(trainer, pl_module)  # numbers already (prog_bar metrics), no tensor read here
        if trainer.training and self._reads_now(trainer, pl_module):
            logged = trainer.callback_metrics
            self._shown = {key: float(v) if isinstance(v, Tensor) else v for key in self.show
                           if (v := logged.get(key)) is not None}
            self._read_at = trainer.global_step
        return {**metrics, **self._shown}
