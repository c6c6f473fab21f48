"""Fast PyTorch path for per-head 1-D convolutions (LightConv, DynamicConv) on any device.

The sequence is cut into chunks of L steps. Each chunk's output is one small matrix product: a band
matrix (L × (L+K−1)) holding the kernel taps on its diagonals, times the chunk's input window
(L+K−1 steps, i.e. with its halo). Cost and memory are linear in T (unlike fairseq's full T×T band) and
the work lands in batched GEMMs instead of K elementwise passes or a K-times unfolded copy of the input.

    y[b, t, c] = Σ_k w[b, t, h(c), k] · x[b, t + k − padding_l, c],   h(c) = c // (C / H)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def default_chunk(kernel_size: int, length: int) -> int:
    """A chunk near the kernel width keeps the band's wasted zeros (≈ L/(L+K)) and the GEMM size balanced."""
    chunk = 16
    while chunk < kernel_size and chunk < 64:
        chunk *= 2
    return max(1, min(chunk, length))


def band_matrices(w: Tensor, chunk: int) -> Tensor:
    """(..., L, K) taps → (..., L, L+K−1) band with ``band[..., i, i+k] = w[..., i, k]``.

    Appending L zero columns and re-reading the flat buffer with a row length one shorter shifts each
    row one step further right than the previous one.
    """
    *lead, length, k = w.shape
    assert length == chunk
    padded = torch.cat([w, w.new_zeros(*lead, chunk, chunk)], dim=-1)  # (..., L, L+K)
    flat = padded.reshape(*lead, chunk * (chunk + k))[..., : chunk * (chunk + k - 1)]
    return flat.reshape(*lead, chunk, chunk + k - 1)


def banded_conv(x: Tensor, weight: Tensor, padding_l: int, chunk: int | None = None) -> Tensor:
    """x: (B, T, C); weight: (H, K) shared over batch and time, or (B, T, H, K) per position.

    Computes in fp32 (or float64) whatever the input dtype, and returns x's dtype.
    """
    out_dtype = x.dtype
    compute = torch.promote_types(torch.promote_types(x.dtype, weight.dtype), torch.float32)
    x, weight = x.to(compute), weight.to(compute)
    bsz, length, channels = x.shape
    heads, k = weight.shape[-2:]
    if channels % heads:
        raise ValueError(f"channels {channels} not divisible by heads {heads}")
    if not 0 <= padding_l < k:
        raise ValueError(f"padding_l={padding_l} must be in [0, {k - 1}] for kernel size {k}")
    g = channels // heads
    chunk = chunk or default_chunk(k, length)
    n = -(-length // chunk)
    padded_len = n * chunk
    xp = F.pad(x, (0, 0, padding_l, padded_len - length + k - 1 - padding_l))  # (B, nL+K-1, C)
    windows = xp.unfold(1, chunk + k - 1, chunk)  # (B, n, C, L+K-1)
    windows = windows.reshape(bsz, n, heads, g, chunk + k - 1).transpose(-1, -2)  # (B, n, H, L+K-1, G)
    if weight.dim() == 2:  # shared taps: one band per head, one wide GEMM per head over all chunks
        band = band_matrices(weight.unsqueeze(1).expand(heads, chunk, k), chunk)  # (H, L, L+K-1)
        cols = windows.permute(2, 3, 0, 1, 4).reshape(heads, chunk + k - 1, bsz * n * g)
        out = torch.matmul(band, cols).view(heads, chunk, bsz, n, g).permute(2, 3, 1, 0, 4)
    else:  # per-position taps: one small GEMM per (batch, chunk, head)
        w = F.pad(weight, (0, 0, 0, 0, 0, padded_len - length))  # (B, nL, H, K)
        w = w.reshape(bsz, n, chunk, heads, k).permute(0, 1, 3, 2, 4)  # (B, n, H, L, K)
        out = torch.matmul(band_matrices(w, chunk), windows).permute(0, 1, 3, 2, 4)  # (B, n, L, H, G)
    return out.reshape(bsz, padded_len, channels)[:, :length].to(out_dtype)
