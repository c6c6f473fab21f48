"""LightConv (Wu et al. 2019 §3): a depthwise convolution whose H heads share softmax-normalized taps.

DropConnect follows the paper: each entry of the normalized (H, K) weights is dropped with probability p
(and the rest scaled by 1/(1−p)) once per forward pass, i.e. shared over batch and time (as fairseq's CUDA
layer; fairseq's unfold path instead drops per (t, b, h, k)).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seqmix.kernel_backend import LIGHTCONV
from seqmix.layers.head_conv import HeadConvolution
from seqmix.mixers.conv_mixer import HeadConvMixer


class LightweightConv(HeadConvolution):
    """``weight`` (H, 1, K) and ``bias`` (C,) as in fairseq's LightweightConv1dTBC."""

    triton_kernel = LIGHTCONV

    def __init__(self, channels: int, kernel_size: int, num_heads: int, weight_softmax: bool = True,
                 weight_dropout: float = 0.0, bias: bool = False, kernel_backend: str = "auto") -> None:
        super().__init__(channels, kernel_size, num_heads, weight_softmax, weight_dropout, kernel_backend)
        self.weight = nn.Parameter(torch.empty(num_heads, 1, kernel_size))
        nn.init.xavier_uniform_(self.weight)
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None

    def raw_taps(self, x: Tensor) -> Tensor:
        return self.weight.squeeze(1)

    def output_bias(self) -> Tensor | None:
        return self.bias


class LightConv(HeadConvMixer):
    conv_cls = LightweightConv
