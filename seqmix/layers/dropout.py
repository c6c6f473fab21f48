"""Dropout with a cheaper CPU mask than ``F.dropout``'s.

PyTorch draws a CPU dropout mask one Bernoulli sample (one 32-bit Mersenne-Twister draw) per element, serially: a
large share of a small model's CPU update (benchmarks/README.md, "Measurements behind the defaults"). Here one 64-bit
draw gives four 16-bit lanes, and an element is dropped when its lane falls below ``round(p · 2¹⁶)``: the drop
probability is p rounded to a multiple of 2⁻¹⁶ (0.1 → 0.100006), and kept elements are scaled by the inverse of the
rounded keep probability, so the layer stays unbiased. CUDA tensors keep ``F.dropout`` (Philox, already fast).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LANES = 2**16


def keep_mask(shape: torch.Size, p: float, device: torch.device, generator: torch.Generator | None = None):
    """(bool mask of kept elements, the exact keep probability it was drawn with)."""
    n = 1
    for size in shape:
        n *= size
    drop = round(p * LANES)
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), 2**63 - 1, generator=generator)
    lanes = words.view(torch.int16)[:n].view(shape)
    return lanes >= drop - LANES // 2, 1.0 - drop / LANES


def dropout(x: Tensor, p: float, training: bool = True, generator: torch.Generator | None = None) -> Tensor:
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p, training)
    keep, keep_prob = keep_mask(x.shape, p, x.device, generator)
    return torch.where(keep, x * (1.0 / keep_prob), 0.0) if keep_prob > 0 else torch.zeros_like(x)


class Dropout(nn.Dropout):
    """``nn.Dropout`` (same ``p`` / ``inplace`` attributes, same state dict) with :func:`dropout`'s CPU mask."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)
