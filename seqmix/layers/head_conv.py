"""Per-head 1-D convolution with softmax-normalized taps and DropConnect: the core shared by LightConv
(taps fixed per head) and DynamicConv (taps predicted per position). Subclasses only say where the raw
taps come from; dispatch between the Triton kernel and the PyTorch path lives here once."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seqmix.errors import SeqmixError
from seqmix.kernel_backend import Kernel, check_backend, triton_function
from seqmix.layers.banded import banded_conv
from seqmix.layers.dropout import dropout


class HeadConvolution(nn.Module):
    #: the Triton op serving CUDA tensors (``seqmix.kernel_backend``)
    triton_kernel: Kernel

    def __init__(self, channels: int, kernel_size: int, num_heads: int, weight_softmax: bool = True,
                 weight_dropout: float = 0.0, kernel_backend: str = "auto") -> None:
        super().__init__()
        if channels % num_heads:
            raise SeqmixError(f"conv channels {channels} must be divisible by num_heads {num_heads}")
        self.channels = channels
        self.num_heads = num_heads
        self.kernel_size = kernel_size
        self.weight_softmax = weight_softmax
        self.weight_dropout = weight_dropout
        self.kernel_backend = check_backend(kernel_backend)

    def raw_taps(self, x: Tensor) -> Tensor:  # pragma: no cover - interface
        """(H, K) or (B, T, H, K) unnormalized taps."""
        raise NotImplementedError

    def output_bias(self) -> Tensor | None:
        return None

    def taps(self, x: Tensor) -> Tensor:
        """Normalized taps in fp32 or wider (softmax over all K taps, then DropConnect in training)."""
        w = self.raw_taps(x)
        w = w.to(torch.promote_types(w.dtype, torch.float32))
        if self.weight_softmax:
            w = torch.softmax(w, dim=-1)
        return dropout(w, p=self.weight_dropout, training=self.training)

    def forward(self, x: Tensor, padding_l: int) -> Tensor:
        y = self.convolve(x, self.taps(x), padding_l)
        bias = self.output_bias()
        return y if bias is None else y + bias

    @torch.compiler.disable
    def convolve(self, x: Tensor, w: Tensor, padding_l: int) -> Tensor:
        """The Triton op or the PyTorch core, opaque to torch.compile: both are already one fused call, and tracing
        them would break on the op lookup (an import) and on the core's strided in-place band writes."""
        kernel = triton_function(self.kernel_backend, x, self.triton_kernel, fallback=banded_conv,
                                 build=(f"K={w.size(-1)}",))
        return banded_conv(x, w, padding_l) if kernel is None else kernel(x, w, padding_l)
