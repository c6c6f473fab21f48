"""Padding masks dropped when nothing is padded, without a host sync on accelerators."""

from __future__ import annotations

import torch
from torch import Tensor

from seqmix.layers.host_reads import reads_freely


def padding_or_none(mask: Tensor) -> Tensor | None:
    """``mask`` (True = pad), or None when nothing is padded so attention can take its unmasked path. Deciding that
    reads the mask back to the host: done on CPU; on other devices the mask is kept (a mask that masks nothing
    changes no value), so a training update makes no host sync. Under torch.compile the mask is kept too: reading it
    would split the graph there (decoding's compiled steps, ``seqmix.models.compiled``)."""
    if not reads_freely(mask.device) or torch.compiler.is_compiling():
        return mask
    return mask if mask.any() else None
