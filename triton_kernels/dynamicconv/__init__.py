"""DynamicConv (Wu et al. 2019) Triton op: `dynamicconv(x, weight, padding_l)`."""

from triton_kernels.dynamicconv.ops import KERNELS, dynamicconv

__all__ = ["KERNELS", "dynamicconv"]
