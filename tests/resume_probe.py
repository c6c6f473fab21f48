"""A callback for the resume tests, loaded by train.py subprocesses: records every training batch's example ids
and, after a chosen update, sends its own process a signal (SIGKILL as the OOM killer would, SIGTERM or SIGUSR1
as a cluster scheduler would)."""

from __future__ import annotations

import json
import os
import signal

import lightning as L


class BatchProbe(L.Callback):
    def __init__(self, path: str, kill_after: int = -1, signal_name: str = "SIGKILL") -> None:
        self.path, self.kill_after, self.signal = path, kill_after, getattr(signal, signal_name)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps([trainer.current_epoch, trainer.global_step, batch["id"].tolist()]) + "\n")

    def on_train_batch_end(self, trainer, *args) -> None:  # runs before the checkpoint callbacks of this update
        if trainer.global_step == self.kill_after:
            os.kill(os.getpid(), self.signal)
