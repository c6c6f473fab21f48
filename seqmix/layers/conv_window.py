"""Where a convolution over time looks: its kernel size in a given layer (one size, or one per layer as in the
papers' 3, 7, 15, 31, ...) and, in an encoder, how the window is centred. Shared by the group's convolution mixers
(LightConv, DynamicConv, TaLK) and ConvS2S's GLU convolutions."""

from __future__ import annotations

from collections.abc import Sequence

from seqmix.errors import SeqmixError


def kernel_size_for_layer(kernel_size: int | Sequence[int], layer_idx: int) -> int:
    if isinstance(kernel_size, int):
        return kernel_size
    sizes = list(kernel_size)
    if layer_idx >= len(sizes):
        raise SeqmixError(f"kernel_size list {sizes} has no entry for layer {layer_idx}; give one per layer")
    return int(sizes[layer_idx])


def encoder_padding(kernel_size: int) -> int:
    """Centered window: K//2 on the left for odd K; fairseq's (K−1)//2 for even K (one more tap on the right)."""
    return kernel_size // 2 if kernel_size % 2 == 1 else (kernel_size - 1) // 2
