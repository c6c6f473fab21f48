"""TaLK convolutions (Lioutas & Guo 2020 §3): each head sums its inputs over an adaptive window whose left
and right extents are predicted per step, normalized by a constant, in O(T) through a summed-area table.

    y_i = (1/K) · ∫_{a_l}^{a_r+1} x[⌊t⌋] dt,    a_l = clamp(i − σ_l·l_max, 0, T−1),  a_r = clamp(i + σ_r·r_max, 0, T−1)

with σ = sigmoid(Linear(x_i)) (encoder: H left + H right offsets; decoder: H left, a_r = i), K = l_max + r_max + 1,
and the integral read off the prefix sums S = cumsum(x / K) by linear interpolation at fractional boundaries.
The gradient to an offset is x at the boundary (S(ceil) − S(floor)), 0 where the boundary is an integer or
clamped. Window arithmetic and sums run in fp32 (or float64) whatever the input dtype.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from seqmix.errors import SeqmixError
from seqmix.kernel_backend import TALK, check_backend, triton_function
from seqmix.layers.conv_window import kernel_size_for_layer
from seqmix.layers.dropout import dropout
from seqmix.mixers.base import MixerState, index_select_batch
from seqmix.mixers.conv_mixer import ProjectedConvMixer, xavier_linear


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def interpolate_prefix(prefix: Tensor, u: Tensor) -> Tensor:
    """prefix: (B, S, H, G) values at integer positions; u: (B, T, H) fractional positions in [0, S−1]."""
    g = prefix.size(-1)
    lo = u.detach().floor()
    hi = u.detach().ceil()
    frac = (u - lo).unsqueeze(-1)
    p_lo = prefix.gather(1, lo.long().unsqueeze(-1).expand(-1, -1, -1, g))
    p_hi = prefix.gather(1, hi.long().unsqueeze(-1).expand(-1, -1, -1, g))
    return p_lo + frac * (p_hi - p_lo)


def window_bounds(left: Tensor, right: Tensor | None, l_max: int, r_max: int,
                  max_offset: float = 1.0) -> tuple[Tensor, Tensor]:
    """(a_l, a_r + 1) per (b, t, head) from the offsets (B, T, H), clamped to [0, max_offset] and to the sequence;
    ``right=None`` is the decoder (a_r = t)."""
    length = left.size(1)
    pos = torch.arange(length, device=left.device, dtype=left.dtype).view(1, length, 1)
    start = (pos - left.clamp(0, max_offset) * l_max).clamp(0, length - 1)
    if right is None:
        return start, (pos + 1).expand_as(start)
    return start, (pos + right.clamp(0, max_offset) * r_max).clamp(0, length - 1) + 1


def talk_window_sum(x: Tensor, left: Tensor, right: Tensor | None, l_max: int, r_max: int,
                    max_offset: float = 1.0) -> Tensor:
    """The fast PyTorch path. x: (B, T, C), pads already zero; left/right: (B, T, H) offsets, clamped to
    [0, max_offset] (1/(1−p) under offset dropout), as the Triton op does; ``right=None`` is the decoder (a_r = i)."""
    bsz, length, channels = x.shape
    heads = left.size(-1)
    if channels % heads:
        raise SeqmixError(f"channels {channels} not divisible by heads {heads}")
    dtype = _compute_dtype(x)
    norm = l_max + r_max + 1
    prefix = F.pad(torch.cumsum(x.to(dtype) / norm, dim=1), (0, 0, 1, 0))  # S[s] = Σ_{j<s} x_j / K
    prefix = prefix.view(bsz, length + 1, heads, channels // heads)
    start, end = window_bounds(left.to(dtype), None if right is None else right.to(dtype), l_max, r_max, max_offset)
    out = interpolate_prefix(prefix, end) - interpolate_prefix(prefix, start)
    return out.reshape(bsz, length, channels).to(x.dtype)


@dataclass
class PrefixState(MixerState):
    """Running prefix sums S(i−l_max) … S(i+1) of a causal TaLK layer (zeros before the sequence)."""

    prefix: Tensor | None = None
    step: int = 0

    def reorder(self, index: Tensor) -> None:
        self.prefix = index_select_batch(self.prefix, index)


class TaLK(ProjectedConvMixer):
    """``kernel_size`` (an int or one per layer) is the layer's maximum offset k: encoder l_max = r_max = k,
    decoder l_max = k, r_max = 0. ``right_kernel_size`` sets the encoder's r_max apart (the paper's Deep
    CNN-DM model uses different left and right lists). ``output_normalization=False`` sums the window instead of
    dividing it by K (Table 7's ablation)."""

    state_class = PrefixState

    def __init__(self, embed_dim: int, num_heads: int, kernel_size: int | Sequence[int], causal: bool = False,
                 layer_idx: int = 0, glu: bool = True, offset_dropout: float = 0.0, input_dropout: float = 0.0,
                 conv_dim: int | None = None, kernel_backend: str = "auto",
                 right_kernel_size: int | Sequence[int] | None = None, output_normalization: bool = True) -> None:
        super().__init__(embed_dim, kernel_size, causal, layer_idx, glu, input_dropout, conv_dim)
        if self.conv_dim % num_heads:
            raise SeqmixError(f"conv channels {self.conv_dim} must be divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.l_max = self.kernel_size
        right = self.kernel_size if right_kernel_size is None else kernel_size_for_layer(right_kernel_size, layer_idx)
        self.r_max = 0 if causal else right
        self.offset_dropout = offset_dropout
        self.kernel_backend = check_backend(kernel_backend)
        self.offset_proj = xavier_linear(self.conv_dim, num_heads * (1 if causal else 2))
        self.output_normalization = output_normalization

    def unnormalized(self, x: Tensor) -> Tensor:
        """Without output normalization (Table 7's first row, which diverged) the window is summed, not averaged:
        scaling the input by K undoes the 1/K inside every path (PyTorch, Triton, step)."""
        return x if self.output_normalization else x * (self.l_max + self.r_max + 1)

    def offsets(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """Relative left/right extents σ ∈ [0, 1] per (b, t, head), then dropout (scaled by 1/(1−p))."""
        sigma = torch.sigmoid(self.offset_proj(x).to(_compute_dtype(x)))
        sigma = dropout(sigma, p=self.offset_dropout, training=self.training)
        if self.causal:
            return sigma, None
        return sigma[..., : self.num_heads], sigma[..., self.num_heads:]

    def max_offset(self) -> float:
        """Largest relative offset after dropout's 1/(1−p) scaling: bounds the window (and the kernel's work)."""
        return 1.0 / (1.0 - self.offset_dropout) if self.training and self.offset_dropout > 0 else 1.0

    def core(self, x: Tensor) -> Tensor:
        left, right = self.offsets(x)
        x = self.unnormalized(x)
        kernel = triton_function(self.kernel_backend, x, TALK, fallback=talk_window_sum)
        fn = talk_window_sum if kernel is None else kernel
        return fn(x, left, right, self.l_max, self.r_max, self.max_offset())

    def core_weights(self, x: Tensor) -> Tensor:
        """Each step's window as weights: the overlap of step s's unit bin [s, s+1) with [a_l, a_r + 1), over K."""
        left, right = self.offsets(x)
        start, end = window_bounds(left, right, self.l_max, self.r_max, self.max_offset())
        bins = torch.arange(x.size(1), device=x.device, dtype=left.dtype)
        overlap = (torch.minimum(bins + 1, end.unsqueeze(-1)) - torch.maximum(bins, start.unsqueeze(-1))).clamp(min=0)
        # (B, T, H, S) → (B, H, T, S), over K as the window sum divides (undone as the core's input is)
        return self.unnormalized(overlap.permute(0, 2, 1, 3) / (self.l_max + self.r_max + 1))

    def step(self, x: Tensor, state: PrefixState) -> Tensor:
        """O(1) per step: extend the running prefix sum, interpolate at the left boundary."""
        bsz, n, channels = x.shape
        dtype = _compute_dtype(x)
        if state.prefix is None:
            state.prefix = x.new_zeros(bsz, self.l_max + 2, channels, dtype=dtype)
        left, _ = self.offsets(x)
        x = self.unnormalized(x)
        outs = []
        for j in range(n):
            i = state.step
            new = state.prefix[:, -1] + x[:, j].to(dtype) / (self.l_max + 1)
            state.prefix = torch.cat([state.prefix[:, 1:], new.unsqueeze(1)], dim=1)  # S(i−l_max) … S(i+1)
            start = (i - left[:, j: j + 1].to(dtype) * self.l_max).clamp(min=0) - (i - self.l_max)
            prefix = state.prefix.view(bsz, self.l_max + 2, self.num_heads, -1)
            y = prefix[:, -1:] - interpolate_prefix(prefix, start)
            outs.append(y.reshape(bsz, 1, channels))
            state.step += 1
        return torch.cat(outs, dim=1).to(x.dtype)
