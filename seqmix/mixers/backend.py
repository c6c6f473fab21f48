"""Choosing between the Triton kernels and the PyTorch path (``kernel_backend: auto | triton | torch``)."""

from __future__ import annotations

import os

from torch import Tensor

BACKENDS = ("auto", "triton", "torch")


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(f"kernel_backend must be one of {BACKENDS}, got {name!r}")
    return name


def use_triton(backend: str, x: Tensor) -> bool:
    """auto: Triton on CUDA tensors, PyTorch elsewhere. triton: always (CUDA, or CPU under TRITON_INTERPRET=1)."""
    if backend == "torch":
        return False
    if backend == "auto":
        return x.is_cuda
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("kernel_backend=triton needs CUDA tensors (or TRITON_INTERPRET=1 for testing on CPU); "
                           "use kernel_backend=auto or torch on this machine")
    return True
