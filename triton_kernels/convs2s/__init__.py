"""ConvS2S (Gehring et al. 2017) decoder-step Triton op: `convs2s_step(window, weight, bias, residual=None)`."""

from triton_kernels.convs2s.ops import KERNELS, convs2s_step

__all__ = ["KERNELS", "convs2s_step"]
