"""Checkpoints written whole or not at all.

Lightning writes a checkpoint straight under its final name, so a run killed (or a disk filling up) during the
write leaves a truncated ``last.ckpt`` where the previous good one was. Here the file is written beside it under
a temporary name, flushed to disk and renamed over it (``seqmix.files.atomic_write``); a failed write removes
the temporary file, keeps the previous checkpoint and ends the run with what to do. Remote paths (``s3://``...)
keep Lightning's own writer.
"""

from __future__ import annotations

import errno

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from seqmix.errors import SeqmixError
from seqmix.files import atomic_write


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        try:
            atomic_write(path, lambda f: torch.save(checkpoint, f))
        except OSError as err:
            hint = "free some disk space" if err.errno in (errno.ENOSPC, errno.EDQUOT) else "check the output folder"
            raise SeqmixError(f"could not write checkpoint {path} ({err.strerror or err}): {hint}, then resume "
                              "from the run's last good checkpoint (ckpt_path=<run dir>/checkpoints/last.ckpt); "
                              "nothing half-written was left") from None
