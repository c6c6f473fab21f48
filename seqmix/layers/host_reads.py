"""How often training may read a tensor back to the host: on CPU a read is free, elsewhere it waits for the queued
work (a host sync), so periodic reads (the non-finite guard, the progress bar) are spaced out there."""

from __future__ import annotations

import torch

ACCELERATOR_READ_INTERVAL = 50  # updates between periodic reads on GPUs


def reads_freely(device: torch.device) -> bool:
    """Whether reading a tensor on ``device`` back to the host is free (CPU) rather than a wait for queued work."""
    return device.type == "cpu"


def read_interval(configured: int | None, device: torch.device) -> int:
    """Updates between periodic reads: ``configured``, or (None or 0) every update on CPU and every 50 elsewhere."""
    if configured:
        return configured
    return 1 if reads_freely(device) else ACCELERATOR_READ_INTERVAL
