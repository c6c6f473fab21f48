"""Comparison helpers for kernel tests: error ratio against a float64 reference, per-dtype limits."""

from __future__ import annotations

import torch

# rms(error) / rms(reference) limits. fp16/bf16 are dominated by rounding the output once
# (2^-11 and 2^-8 relative), since the reference sees the same rounded inputs.
RATIO_LIMIT = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# Max |error| / max |reference|: catches a few wrong elements that an rms ratio would average away.
MAX_LIMIT = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
ABS_FLOOR = 1e-6  # references that are ~0 are compared absolutely


def assert_close(name: str, actual: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.shape == ref.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(ref.shape)}"
    assert not torch.isnan(actual).any(), f"{name}: NaN in output (unwritten element or bad math)"
    diff = actual.detach().double() - ref.double()
    ref_rms = max(ref.double().pow(2).mean().sqrt().item(), ABS_FLOOR)
    ref_max = max(ref.double().abs().max().item(), ABS_FLOOR)
    ratio = diff.pow(2).mean().sqrt().item() / ref_rms
    max_ratio = diff.abs().max().item() / ref_max
    assert ratio <= RATIO_LIMIT[dtype], f"{name}: rms error ratio {ratio:.3g} > {RATIO_LIMIT[dtype]} ({dtype})"
    assert max_ratio <= MAX_LIMIT[dtype], f"{name}: max error ratio {max_ratio:.3g} > {MAX_LIMIT[dtype]} ({dtype})"


def pad_tail(x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """Zero each row's time steps past its length (padded batch)."""
    x = x.clone()
    for b, n in enumerate(lengths):
        x[b, n:] = 0
    return x
