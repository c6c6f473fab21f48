"""Choosing between the Triton kernels and the PyTorch path (``kernel_backend: auto | triton | torch``)."""

from __future__ import annotations

import os

import torch
from torch import Tensor

from seqmix.errors import SeqmixError

BACKENDS = ("auto", "triton", "torch")
NEEDS_CUDA = ("kernel_backend=triton needs a CUDA GPU (or TRITON_INTERPRET=1 for testing on CPU); use "
              "kernel_backend=auto or torch on this machine")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_backend(name: str) -> str:
    """Refuse at build time, not at the first batch, a backend this machine cannot run."""
    if name not in BACKENDS:
        raise SeqmixError(f"kernel_backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name == "triton" and not torch.cuda.is_available() and not _interpreting():
        raise SeqmixError(NEEDS_CUDA)
    return name


def use_triton(backend: str, x: Tensor) -> bool:
    """auto: Triton on CUDA tensors, PyTorch elsewhere. triton: always (CUDA, or CPU under TRITON_INTERPRET=1)."""
    if backend == "torch":
        return False
    if backend == "auto":
        return x.is_cuda
    if not x.is_cuda and not _interpreting():
        raise SeqmixError(NEEDS_CUDA)
    return True


def triton_function(backend: str, x: Tensor, module: str, name: str):
    """The Triton op ``triton_kernels.<module>.ops.<name>`` when this call should use it, else None.

    ``auto`` falls back to the PyTorch path (which also runs on CUDA) while an op has no kernel yet;
    an explicit ``triton`` request for a missing kernel is an error.
    """
    if not use_triton(backend, x):
        return None
    import importlib

    try:
        ops = importlib.import_module(f"triton_kernels.{module}.ops")
    except ModuleNotFoundError as err:
        if backend == "triton" and err.name and err.name.startswith("triton_kernels"):
            raise SeqmixError(f"there is no Triton kernel for {module} yet; use kernel_backend=torch or auto") from None
        if err.name and err.name.startswith("triton_kernels"):
            return None
        raise
    return getattr(ops, name)
