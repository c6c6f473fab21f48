"""ConvS2S's token mixer (Gehring et al. 2017 §3.2): zero the pads → dropout → conv1d(d_in, 2·d_out, k) → GLU
[→ (+ residual)·√0.5].

Unlike the other mixers it may change the width (d_in → d_out), and the block around it is ConvS2S's own
(residual ·√0.5, attention; ``seqmix.models.convs2s``), not the shared Transformer block. The residual is taken
here only by blocks where it directly follows the GLU (no attention in between), so that a decoder step can
run conv + bias + GLU + residual as one Triton kernel on CUDA (``triton_kernels.convs2s``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from seqmix.errors import SeqmixError
from seqmix.kernel_backend import CONVS2S_STEP, check_backend, triton_function
from seqmix.layers.conv_window import encoder_padding, kernel_size_for_layer
from seqmix.layers.dropout import dropout
from seqmix.mixers.base import TokenMixer, WindowState, check_incremental_call, zero_padding

SQRT_HALF = math.sqrt(0.5)


def glu_conv1d(n_in: int, n_out: int, kernel: int, dropout: float) -> nn.Conv1d:
    """Weight-normalized Conv1d(n_in, n_out, k) feeding a GLU, with N(0, √(4(1−p)/(k·n_in))) weights: the GLU
    quarters the variance (appendix A.1) and dropout p in front raises it by 1/(1−p) (A.3). Zero bias."""
    conv = nn.Conv1d(n_in, n_out, kernel)
    nn.init.normal_(conv.weight, mean=0.0, std=math.sqrt(4.0 * (1.0 - dropout) / (kernel * n_in)))
    nn.init.zeros_(conv.bias)
    return weight_norm(conv, dim=0)


@dataclass
class LinearizedState(WindowState):
    """The last k−1 inputs, plus the conv weight folded for one matmul, computed at the first step of a decode
    (re-folding the weight norm every step is a large part of a step's conv time; triton_kernels/convs2s/README.md).
    Kept only while autograd is off, where the weights cannot change."""

    weight: Tensor | None = None


class GLUConv(TokenMixer):
    """(B, T, embed_dim) → (B, T, out_dim).

    Encoder: 'same' padding (k//2 each side for odd k; one more tap on the right for even k, as fairseq).
    Decoder (causal): k−1 zeros on the left, so output t sees inputs t−k+1..t. A decoder step keeps the last
    k−1 inputs in a :class:`LinearizedState` and applies the kernel as one matmul over [window, new input]
    (a linearized convolution); several new steps in one call work too. ``residual`` (same shape as the
    output): return (GLU + residual)·√0.5. ``kernel_backend``: the decoder step on CUDA tensors runs the fused
    Triton kernel (auto | triton | torch); CPU and the full-sequence pass use PyTorch.
    """

    state_class = LinearizedState

    def __init__(self, embed_dim: int, kernel_size: int | Sequence[int], causal: bool = False, layer_idx: int = 0,
                 out_dim: int | None = None, input_dropout: float = 0.0, kernel_backend: str = "auto") -> None:
        super().__init__(embed_dim, causal, layer_idx)
        self.kernel_backend = check_backend(kernel_backend)
        self.kernel_size = kernel_size_for_layer(kernel_size, layer_idx)
        if self.kernel_size < 1:
            raise SeqmixError("kernel_size must be >= 1")
        self.out_dim = out_dim or embed_dim
        self.input_dropout = input_dropout
        self.pad_left = self.kernel_size - 1 if causal else encoder_padding(self.kernel_size)
        self.pad_right = self.kernel_size - 1 - self.pad_left
        self.conv = glu_conv1d(embed_dim, 2 * self.out_dim, self.kernel_size, input_dropout)

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, state: WindowState | None = None,
                residual: Tensor | None = None) -> Tensor:
        check_incremental_call(self, x, state)
        x = dropout(zero_padding(x, key_padding_mask), p=self.input_dropout, training=self.training)
        if state is not None:
            return self.step(x, state, residual)
        h = F.pad(x.transpose(1, 2), (self.pad_left, self.pad_right))
        y = F.glu(self.conv(h), dim=1).transpose(1, 2)
        return y if residual is None else (y + residual) * SQRT_HALF

    def linearized_weight(self, tap_major: bool = False) -> Tensor:
        """The effective (weight-normalized) conv weight for one matmul over k time steps, (2·out_dim, k·embed_dim).
        Column c·k + j by default: the conv weight's own layout (a view), matching ``unfold``'s taps.
        ``tap_major``: column j·embed_dim + c (a copy), so a step's taps are one contiguous span of the window,
        the layout of the Triton kernel."""
        weight = self.conv.weight
        return weight.permute(0, 2, 1).flatten(1) if tap_major else weight.flatten(1)

    def step(self, x: Tensor, state: WindowState, residual: Tensor | None = None) -> Tensor:
        history = self.kernel_size - 1
        if state.window is None:
            state.window = x.new_zeros(x.size(0), history, x.size(2))
        window = torch.cat([state.window, x], dim=1)  # (B, k−1+n, C), contiguous
        state.window = window[:, window.size(1) - history:]
        kernel = triton_function(self.kernel_backend, x, CONVS2S_STEP)
        cache = isinstance(state, LinearizedState) and not torch.is_grad_enabled()
        if cache and state.weight is not None:
            weight = state.weight
        else:
            weight = self.linearized_weight(tap_major=kernel is not None)
            if cache:  # backend and device are fixed for a decode, hence the layout too
                state.weight = weight
        if kernel is not None:
            return kernel(window, weight, self.conv.bias, residual)
        taps = window.unfold(1, self.kernel_size, 1).flatten(2)  # (B, n, C·k), index c·k + j
        y = F.glu(F.linear(taps, weight, self.conv.bias), dim=-1)
        return y if residual is None else (y + residual) * SQRT_HALF
