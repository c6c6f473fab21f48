"""Fused output projection + label-smoothed cross-entropy Triton op: `fused_label_smoothed_loss(...)`."""

from triton_kernels.fused_xent.ops import KERNELS, fused_label_smoothed_loss

__all__ = ["KERNELS", "fused_label_smoothed_loss"]
