"""LightConv (Wu et al. 2019) Triton op: `lightconv(x, weight, padding_l)`."""

from triton_kernels.lightconv.ops import KERNELS, lightconv

__all__ = ["KERNELS", "lightconv"]
