"""Comparison helpers for kernel tests: error ratio against a float64 reference, per-dtype limits."""

from __future__ import annotations

import torch

from triton_kernels.common import ABS_FLOOR, MAX_LIMIT, RATIO_LIMIT


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
