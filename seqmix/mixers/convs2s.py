"""ConvS2S's token mixer (Gehring et al. 2017 §3.2): zero the pads → dropout → conv1d(d_in, 2·d_out, k) → GLU.

Unlike the other mixers it may change the width (d_in → d_out), and the block around it is ConvS2S's own
(residual ·√0.5, attention; ``seqmix.models.convs2s``), not the shared Transformer block.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.parametrizations import weight_norm

from seqmix.mixers.base import TokenMixer, check_incremental_call, zero_padding
from seqmix.mixers.conv_block import WindowState, encoder_padding, kernel_size_for_layer


def glu_conv1d(n_in: int, n_out: int, kernel: int, dropout: float) -> nn.Conv1d:
    """Weight-normalized Conv1d(n_in, n_out, k) feeding a GLU, with N(0, √(4(1−p)/(k·n_in))) weights: the GLU
    quarters the variance (appendix A.1) and dropout p in front raises it by 1/(1−p) (A.3). Zero bias."""
    conv = nn.Conv1d(n_in, n_out, kernel)
    nn.init.normal_(conv.weight, mean=0.0, std=math.sqrt(4.0 * (1.0 - dropout) / (kernel * n_in)))
    nn.init.zeros_(conv.bias)
    return weight_norm(conv, dim=0)


class GLUConv(TokenMixer):
    """(B, T, embed_dim) → (B, T, out_dim).

    Encoder: 'same' padding (k//2 each side for odd k; one more tap on the right for even k, as fairseq).
    Decoder (causal): k−1 zeros on the left, so output t sees inputs t−k+1..t. A decoder step keeps the last
    k−1 inputs in a :class:`WindowState` and applies the kernel as one matmul over [window, new input]
    (a linearized convolution); several new steps in one call work too.
    """

    def __init__(self, embed_dim: int, kernel_size: int | Sequence[int], causal: bool = False, layer_idx: int = 0,
                 out_dim: int | None = None, input_dropout: float = 0.0) -> None:
        super().__init__(embed_dim, causal, layer_idx)
        self.kernel_size = kernel_size_for_layer(kernel_size, layer_idx)
        if self.kernel_size < 1:
            raise ValueError("kernel_size must be >= 1")
        self.out_dim = out_dim or embed_dim
        self.input_dropout = input_dropout
        self.pad_left = self.kernel_size - 1 if causal else encoder_padding(self.kernel_size)
        self.pad_right = self.kernel_size - 1 - self.pad_left
        self.conv = glu_conv1d(embed_dim, 2 * self.out_dim, self.kernel_size, input_dropout)

    def init_state(self) -> WindowState:
        if not self.causal:
            raise NotImplementedError("incremental decoding needs a causal mixer")
        return WindowState()

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None, state: WindowState | None = None) -> Tensor:
        check_incremental_call(self, x, state)
        x = F.dropout(zero_padding(x, key_padding_mask), p=self.input_dropout, training=self.training)
        if state is not None:
            return self.step(x, state)
        h = F.pad(x.transpose(1, 2), (self.pad_left, self.pad_right))
        return F.glu(self.conv(h), dim=1).transpose(1, 2)

    def step(self, x: Tensor, state: WindowState) -> Tensor:
        history = self.kernel_size - 1
        if state.window is None:
            state.window = x.new_zeros(x.size(0), history, x.size(2))
        window = torch.cat([state.window, x], dim=1)  # (B, k−1+n, C)
        taps = window.unfold(1, self.kernel_size, 1).flatten(2)  # (B, n, C·k), index c·k + j as in the weight
        y = F.linear(taps, self.conv.weight.flatten(1), self.conv.bias)
        state.window = window[:, window.size(1) - history:]
        return F.glu(y, dim=-1)
