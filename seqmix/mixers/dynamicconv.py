"""DynamicConv (Wu et al. 2019 §4): LightConv whose (H, K) taps are predicted at every time step by a
Linear(d, H·K) of the conv input at that step (index h·K + k, as fairseq), softmax-normalized over all
K taps — also when the sequence is shorter than K (fairseq's unfold path narrows first; we do not).
DropConnect drops each normalized tap (b, t, h, k) independently.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seqmix.kernel_backend import DYNAMICCONV
from seqmix.layers.head_conv import HeadConvolution
from seqmix.mixers.conv_mixer import HeadConvMixer, xavier_linear


class DynamicConvolution(HeadConvolution):
    """``weight_linear`` (C → H·K) and optional ``conv_bias`` (C,) as in fairseq's DynamicConv1dTBC."""

    triton_kernel = DYNAMICCONV

    def __init__(self, channels: int, kernel_size: int, num_heads: int, weight_softmax: bool = True,
                 weight_dropout: float = 0.0, bias: bool = False, kernel_backend: str = "auto") -> None:
        super().__init__(channels, kernel_size, num_heads, weight_softmax, weight_dropout, kernel_backend)
        self.weight_linear = xavier_linear(channels, num_heads * kernel_size, bias=bias)
        self.conv_bias = nn.Parameter(torch.zeros(channels)) if bias else None

    def raw_taps(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return self.weight_linear(x).view(b, t, self.num_heads, self.kernel_size)

    def output_bias(self) -> Tensor | None:
        return self.conv_bias


class DynamicConv(HeadConvMixer):
    conv_cls = DynamicConvolution
