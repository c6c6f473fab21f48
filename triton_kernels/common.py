"""Helpers shared by the LightConv and DynamicConv Triton ops (validation, blocks, op registration).

Kept deliberately small: anything op-specific lives in the op's own folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The tap loop is a runtime loop (not unrolled), so registers do not grow with K; the cap only bounds
# compile variety and what the AOT test has to vouch for.
MAX_K = 128
_INT32_MAX = 2**31 - 1
_TRITON_TYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# The accuracy the kernels promise against a float64 reference on the same (rounded) inputs, per dtype; the kernel
# tests and the GPU check (benchmarks/kernels.py) hold them to it. rms(error) / rms(reference): fp16/bf16 are
# dominated by rounding the output once (2^-11 and 2^-8 relative).
RATIO_LIMIT = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# max |error| / max |reference|: catches a few wrong elements that an rms ratio would average away.
MAX_LIMIT = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
ABS_FLOOR = 1e-6  # references that are ~0 are compared absolutely


# Read once at import: @triton.jit picks interpreter vs. compiler when the kernels are defined (also at
# import), and torch.compile cannot trace triton's C-level env lookup.
_INTERPRETING = bool(triton.knobs.runtime.interpret)
# NaN-fill fresh outputs so an element a kernel forgot to write fails loudly. Always on under the
# interpreter (tests); on GPU only with SEQMIX_TRITON_NAN_FILL=1, as the fill is an extra memory pass.
_NAN_FILL = _INTERPRETING or os.environ.get("SEQMIX_TRITON_NAN_FILL", "0") == "1"


def interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return _INTERPRETING


def nan_fill_outputs() -> bool:
    return _NAN_FILL


def new_output(shape, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if nan_fill_outputs():
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


def next_power_of_2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def clamp_block(n: int, lo: int, hi: int) -> int:
    """Power-of-two block covering n, kept in [lo, hi] (tl.arange needs powers of two)."""
    return max(lo, min(hi, next_power_of_2(n)))


def triton_type(dtype: torch.dtype) -> str:
    """Triton signature spelling of a supported torch dtype ("fp16", ...), for AOT signatures."""
    return _TRITON_TYPE[dtype]


def check_tensor(name: str, t: Any, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if t.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has unsupported dtype {t.dtype}; supported: float32, float16, bfloat16")


def check_device(x: torch.Tensor, *others: tuple[str, torch.Tensor]) -> None:
    """Kernels run on CUDA, or on CPU only through the Triton interpreter."""
    dev = x.device
    if dev.type != "cuda" and not (dev.type == "cpu" and interpreting()):
        raise ValueError(
            f"Triton kernels need a CUDA tensor (or CPU with TRITON_INTERPRET=1 set before import); "
            f"got device {dev}"
        )
    for name, t in others:
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device} but x is on {dev}")


def check_kernel_size(K: int) -> None:
    if K < 1 or K > MAX_K:
        raise ValueError(f"kernel size K={K} is not supported (1 <= K <= {MAX_K})")


def check_padding(padding_l: Any, K: int) -> int:
    if isinstance(padding_l, bool) or not isinstance(padding_l, int):
        raise TypeError(f"padding_l must be an int, got {type(padding_l).__name__}")
    if not 0 <= padding_l <= K - 1:
        raise ValueError(f"padding_l={padding_l} out of range [0, K-1={K - 1}]")
    return padding_l


def check_heads(C: int, H: int) -> int:
    """Channels per head; heads are contiguous channel blocks, so C must split evenly."""
    if H < 1 or C % H != 0:
        raise ValueError(f"channels C={C} must be divisible by the number of heads H={H}")
    return C // H


def check_int32(what: str, n: int) -> None:
    """In-kernel offsets within one batch row are int32; refuse sizes that would wrap."""
    if n > _INT32_MAX:
        raise ValueError(f"{what}={n} exceeds int32 indexing of the kernels")


def autocast_inputs(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Under autocast for the tensors' device, run the op in the autocast dtype (fp16/bf16).

    Custom ops are not covered by autocast's op lists, so we cast explicitly; the cast sits in the
    autograd graph, so gradients flow back to fp32 parameters in their own dtype.
    """
    dev = tensors[0].device.type
    if dev not in ("cuda", "cpu") or not torch.is_autocast_enabled(dev):
        return tensors
    dtype = torch.get_autocast_dtype(dev)
    return tuple(t.to(dtype) for t in tensors)


def define_op(name: str, fn: Callable, fake: Callable):
    """Register `fn` as a torch op traceable by torch.compile.

    On GPU it is a `triton_op` (the compiler sees the kernels). Under the interpreter the kernels are
    plain Python callables that read tensor data, which functionalization/fake tracing cannot do, so
    the op is registered opaque (`custom_op` + fake impl) instead. Same body, same schema.
    """
    if interpreting():
        op = torch.library.custom_op(name, fn, mutates_args=())
        op.register_fake(fake)
        return op
    return torch.library.triton_op(name, fn, mutates_args=())


@dataclass(frozen=True)
class KernelSpec:
    """One @triton.jit kernel and how to AOT-compile it.

    `build(K, dtype, C, H)` returns (signature, constexprs, num_warps) exactly as the op would launch
    it for that model width C and head count H (block sizes may depend on C/H; runtime ints do not).
    """

    name: str
    fn: Any
    build: Callable[[int, torch.dtype, int, int], tuple[dict[str, str], dict[str, Any], int]]
    notes: str = ""
    k_constexpr: bool = True  # False: K is a runtime argument, so one compile (at any K) covers them all


def register_conv_op(name: str, validate: Callable, launch_forward: Callable, launch_backward: Callable,
                     doc: str) -> Callable:
    """Register ``seqmix::<name>_forward`` / ``_backward`` with autograd and return the public function.

    Both convolution ops (LightConv, DynamicConv) take ``(x, weight, padding_l)`` and return ``y``; the
    backward op returns ``(dx, dw)``. Only the validation and the kernel launches differ between them.
    """

    def forward_body(x: torch.Tensor, weight: torch.Tensor, padding_l: int) -> torch.Tensor:
        return launch_forward(x.contiguous(), weight.contiguous(), padding_l)

    def forward_fake(x: torch.Tensor, weight: torch.Tensor, padding_l: int) -> torch.Tensor:
        validate(x, weight, padding_l)
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    def backward_body(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, padding_l: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        return launch_backward(dy.to(x.dtype).contiguous(), x.contiguous(), weight.contiguous(), padding_l)

    def backward_fake(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, padding_l: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        validate(x, weight, padding_l)
        return (torch.empty_like(x, memory_format=torch.contiguous_format),
                torch.empty_like(weight, memory_format=torch.contiguous_format))

    forward_op = define_op(f"seqmix::{name}_forward", forward_body, forward_fake)
    backward_op = define_op(f"seqmix::{name}_backward", backward_body, backward_fake)

    def setup_context(ctx, inputs, output) -> None:
        x, weight, padding_l = inputs
        ctx.save_for_backward(x, weight)
        ctx.padding_l = padding_l

    def autograd_backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx, dw = backward_op(dy, x, weight, ctx.padding_l)
        return dx, dw, None

    forward_op.register_autograd(autograd_backward, setup_context=setup_context)

    def public(x: torch.Tensor, weight: torch.Tensor, padding_l: int) -> torch.Tensor:
        validate(x, weight, padding_l)
        x, weight = autocast_inputs(x, weight)
        return forward_op(x, weight, padding_l)

    public.__name__ = name
    public.__doc__ = doc
    public.forward_op, public.backward_op = forward_op, backward_op
    return public
