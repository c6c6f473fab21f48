"""Choosing between the Triton kernels and the PyTorch path (``kernel_backend: auto | triton | torch``), and the one
module that imports ``triton_kernels``.

Each kernel is imported on its first use, not when seqmix is imported: Triton is absent from CPU-only installs on
some platforms, importing it costs start-up time, and ``TRITON_INTERPRET`` must be set before the kernels are
defined (tests set it first). Callers name a kernel by one of the constants below, never by a string.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from seqmix.errors import SeqmixError

BACKENDS = ("auto", "triton", "torch")
NEEDS_CUDA = ("kernel_backend=triton needs a CUDA GPU (or TRITON_INTERPRET=1 for testing on CPU); use "
              "kernel_backend=auto or torch on this machine")


def _lightconv() -> Callable:
    from triton_kernels.lightconv import lightconv
    return lightconv


def _dynamicconv() -> Callable:
    from triton_kernels.dynamicconv import dynamicconv
    return dynamicconv


def _talk() -> Callable:
    from triton_kernels.talk import talk
    return talk


def _convs2s_step() -> Callable:
    from triton_kernels.convs2s import convs2s_step
    return convs2s_step


def _fused_label_smoothed_loss() -> Callable:
    from triton_kernels.fused_xent import fused_label_smoothed_loss
    return fused_label_smoothed_loss


@dataclass(frozen=True)
class Kernel:
    """A Triton op of ``triton_kernels``, imported by ``load`` on first use."""

    name: str
    load: Callable[[], Callable]


LIGHTCONV = Kernel("lightconv", _lightconv)
DYNAMICCONV = Kernel("dynamicconv", _dynamicconv)
TALK = Kernel("talk", _talk)
CONVS2S_STEP = Kernel("convs2s_step", _convs2s_step)
FUSED_LABEL_SMOOTHED_LOSS = Kernel("fused_label_smoothed_loss", _fused_label_smoothed_loss)


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


# (kernel, dtype, build) keys whose first launch built and ran, and those whose build failed (with the error): under
# ``auto`` a failed one runs the PyTorch path for the rest of the process
_LAUNCHED: set[tuple] = set()
_UNAVAILABLE: dict[tuple, str] = {}


def triton_function(backend: str, x: Tensor, kernel: Kernel, fallback: Callable | None = None,
                    build: tuple[str, ...] = ()) -> Callable | None:
    """``kernel``'s op when this call should use Triton, else None (the caller's PyTorch path). Without Triton
    installed, ``auto`` falls back to the PyTorch path (which also runs on CUDA) and ``triton`` is an error. Under
    ``auto`` with a ``fallback`` (the PyTorch path, same arguments), a kernel whose first launch for x's dtype and
    ``build`` (what else it is compiled for, e.g. ``("K=31",)``: one K can need more shared memory than another) fails
    in Triton (a compile error, too little shared memory on this GPU) warns once and runs ``fallback`` from then on."""
    if not use_triton(backend, x):
        return None
    key = (kernel.name, x.dtype, *build)
    if backend == "auto" and key in _UNAVAILABLE:
        return None
    try:
        op = kernel.load()
    except ModuleNotFoundError as err:
        if err.name != "triton" and not (err.name or "").startswith("triton."):
            raise
        if backend == "triton":
            raise SeqmixError(f"kernel_backend=triton: Triton is not installed, so the {kernel.name} kernel cannot "
                              "run; install triton or use kernel_backend=auto") from None
        return None
    if backend != "auto" or fallback is None or key in _LAUNCHED or torch.compiler.is_compiling():
        return op

    def first_launch(*args):
        try:
            out = op(*args)
        except Exception as err:
            if type(err).__module__.split(".")[0] != "triton":
                raise
            _UNAVAILABLE[key] = f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
            built_for = ", ".join([str(x.dtype)[6:], *build])
            warnings.warn(f"seqmix: the {kernel.name} Triton kernel failed to build for {built_for} on this GPU "
                          f"({_UNAVAILABLE[key]}); running its PyTorch path instead (kernel_backend=torch to choose "
                          "it, kernel_backend=triton to make this an error)", stacklevel=2)
            return fallback(*args)
        _LAUNCHED.add(key)
        return out

    return first_launch
