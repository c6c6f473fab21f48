"""TaLK convolutions (Lioutas & Guo 2020) Triton op: `talk(x, left, right, l_max, r_max, max_offset)`."""

from triton_kernels.talk.ops import KERNELS, talk

__all__ = ["KERNELS", "talk"]
