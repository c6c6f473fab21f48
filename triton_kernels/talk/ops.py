"""TaLK as torch ops backed by Triton: forward, backward (dx, dleft, dright), autograd, AMP, AOT specs.

Public: ``talk(x, left, right, l_max, r_max, max_offset=1.0)``; the registered ops
``torch.ops.seqmix.talk_forward`` / ``talk_backward``; ``KERNELS`` (AOT signatures for tests/kernels).
``left``/``right`` are the relative offsets σ (B, T, H), usually fp32 (the mixer computes them in fp32);
``right=None`` is the decoder (window ends at the current step, r_max must be 0). ``max_offset`` bounds
the offsets (1/(1−p) under offset dropout): larger ones are clamped, which is what bounds how many windows
the input-gradient kernel has to visit per position.
"""

from __future__ import annotations

import math

import torch
import triton
from torch.library import wrap_triton

from triton_kernels.common import (
    KernelSpec,
    autocast_inputs,
    check_device,
    check_heads,
    check_int32,
    check_tensor,
    clamp_block,
    define_op,
    new_output,
    triton_type,
)
from triton_kernels.talk.kernels import (
    talk_bwd_input_kernel,
    talk_bwd_offsets_kernel,
    talk_fwd_kernel,
    talk_prefix_kernel,
)

__all__ = ["talk", "talk_forward", "talk_backward", "KERNELS"]

_NUM_WARPS = 4
MAX_OFFSET = 4096  # l_max / r_max cap: keeps the gather loop of the input gradient bounded


def _blocks(D: int) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_D): one head's channels (up to 64) by enough time steps for ~2048-element tiles."""
    block_d = clamp_block(D, 16, 64)
    return min(64, 2048 // block_d), block_d


def _prefix_blocks(C: int) -> tuple[int, int]:
    block_c = clamp_block(C, 16, 64)
    return 2048 // block_c, block_c


def _validate(x, left, right, l_max, r_max, max_offset) -> tuple[int, int, int, int, int]:
    check_tensor("x", x, 3)
    check_tensor("left", left, 3)
    B, T, C = x.shape
    H = left.shape[2]
    if tuple(left.shape[:2]) != (B, T):
        raise ValueError(f"left must be (B, T, H) = ({B}, {T}, H), got {tuple(left.shape)}")
    others = [("left", left)]
    if right is not None:
        check_tensor("right", right, 3)
        if right.shape != left.shape:
            raise ValueError(f"right {tuple(right.shape)} must have the shape of left {tuple(left.shape)}")
        others.append(("right", right))
    elif r_max != 0:
        raise ValueError(f"right=None is the causal (decoder) window; r_max must be 0, got {r_max}")
    check_device(x, *others)
    for name, v in (("l_max", l_max), ("r_max", r_max)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_OFFSET:
            raise ValueError(f"{name} must be an int in [0, {MAX_OFFSET}], got {v!r}")
    if not (isinstance(max_offset, (int, float)) and 0 < max_offset <= 16 and math.isfinite(max_offset)):
        raise ValueError(f"max_offset must be a number in (0, 16], got {max_offset!r}")
    D = check_heads(C, H)
    check_int32("(T+1)*C", (T + 1) * C)
    check_int32("T*H", T * H)
    return B, T, C, H, D


def _prefix(x: torch.Tensor, norm: int, blocks: tuple[int, int] | None = None) -> torch.Tensor:
    B, T, C = x.shape
    s = new_output((B, T + 1, C), torch.float32, x.device)
    block_t, block_c = blocks or _prefix_blocks(C)
    wrap_triton(talk_prefix_kernel)[(B, triton.cdiv(C, block_c))](
        x, s, T, C, 1.0 / norm, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=_NUM_WARPS,
    )
    return s


def _launch_forward(x, left, right, l_max, r_max, max_offset, blocks=None) -> torch.Tensor:
    """``blocks`` overrides (BLOCK_T, BLOCK_D) (tests use it to hit tile edges with tiny shapes)."""
    B, T, C, H, D = _validate(x, left, right, l_max, r_max, max_offset)
    y = new_output(x.shape, x.dtype, x.device)
    if y.numel() == 0:
        return y
    s = _prefix(x, l_max + r_max + 1, blocks)
    block_t, block_d = blocks or _blocks(D)
    grid = (B * triton.cdiv(T, block_t), H * triton.cdiv(D, block_d))
    wrap_triton(talk_fwd_kernel)[grid](
        s, left, left if right is None else right, y, T, C, H, D, l_max, r_max, float(max_offset),
        CAUSAL=right is None, BLOCK_T=block_t, BLOCK_D=block_d, num_warps=_NUM_WARPS,
    )
    return y


def _launch_backward(dy, x, left, right, l_max, r_max, max_offset, blocks=None):
    B, T, C, H, D = _validate(x, left, right, l_max, r_max, max_offset)
    if dy.shape != x.shape:
        raise ValueError(f"grad_output shape {tuple(dy.shape)} != x shape {tuple(x.shape)}")
    dx = new_output(x.shape, x.dtype, x.device)
    dleft = new_output(left.shape, torch.float32, x.device)
    dright = new_output(left.shape if right is not None else (0,), torch.float32, x.device)
    if x.numel() == 0:
        return dx.zero_(), dleft.zero_().to(left.dtype), dright.zero_().to(left.dtype)
    causal = right is None
    right = left if causal else right
    inv_norm = 1.0 / (l_max + r_max + 1)
    block_t, block_d = blocks or _blocks(D)
    n_tb = triton.cdiv(T, block_t)
    wrap_triton(talk_bwd_input_kernel)[(B * n_tb, H * triton.cdiv(D, block_d))](
        dy, left, right, dx, T, C, H, D, l_max, r_max, float(max_offset), inv_norm,
        math.ceil(l_max * max_offset), math.ceil(r_max * max_offset),
        CAUSAL=causal, BLOCK_T=block_t, BLOCK_D=block_d, num_warps=_NUM_WARPS,
    )
    wrap_triton(talk_bwd_offsets_kernel)[(B * n_tb, H)](
        dy, x, left, right, dleft, dleft if causal else dright, T, C, H, D, l_max, r_max, float(max_offset),
        inv_norm, CAUSAL=causal, BLOCK_T=block_t, BLOCK_D=block_d, num_warps=_NUM_WARPS,
    )
    return dx, dleft.to(left.dtype), dright.to(left.dtype)


def _forward_body(x: torch.Tensor, left: torch.Tensor, right: torch.Tensor | None, l_max: int, r_max: int,
                  max_offset: float) -> torch.Tensor:
    return _launch_forward(x.contiguous(), left.contiguous(), None if right is None else right.contiguous(),
                           l_max, r_max, max_offset)


def _forward_fake(x, left, right, l_max, r_max, max_offset):
    _validate(x, left, right, l_max, r_max, max_offset)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _backward_body(dy: torch.Tensor, x: torch.Tensor, left: torch.Tensor, right: torch.Tensor | None,
                   l_max: int, r_max: int, max_offset: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _launch_backward(dy.to(x.dtype).contiguous(), x.contiguous(), left.contiguous(),
                            None if right is None else right.contiguous(), l_max, r_max, max_offset)


def _backward_fake(dy, x, left, right, l_max, r_max, max_offset):
    _validate(x, left, right, l_max, r_max, max_offset)
    dright = torch.empty_like(left) if right is not None else left.new_empty(0)
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(left), dright


talk_forward = define_op("seqmix::talk_forward", _forward_body, _forward_fake)
talk_backward = define_op("seqmix::talk_backward", _backward_body, _backward_fake)


def _setup_context(ctx, inputs, output) -> None:
    x, left, right, l_max, r_max, max_offset = inputs
    ctx.save_for_backward(x, left, right)
    ctx.args = (l_max, r_max, max_offset)


def _autograd_backward(ctx, dy):
    x, left, right = ctx.saved_tensors
    dx, dleft, dright = talk_backward(dy, x, left, right, *ctx.args)
    return dx, dleft, (dright if right is not None else None), None, None, None


talk_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def talk(x: torch.Tensor, left: torch.Tensor, right: torch.Tensor | None, l_max: int, r_max: int,
         max_offset: float = 1.0) -> torch.Tensor:
    """y[b,t,c] = (1/K) ∫_{start}^{end} x[b, ⌊u⌋, c] du with K = l_max + r_max + 1,
    start = clamp(t − left[b,t,h]·l_max, 0, T−1), end = clamp(t + right[b,t,h]·r_max, 0, T−1) + 1
    (decoder, ``right=None``: end = t + 1), h = c // (C // H). Output in x.dtype, fp32 sums.
    Under autocast x is cast to the autocast dtype; the offsets keep their (fp32) dtype."""
    _validate(x, left, right, l_max, r_max, max_offset)
    (x,) = autocast_inputs(x)
    return talk_forward(x, left, right, l_max, r_max, float(max_offset))


def _sig(names_types: dict[str, str], dtype: torch.dtype, offset_dtype: str = "fp32") -> dict[str, str]:
    ty = "*" + triton_type(dtype)
    return {k: (ty if v == "X" else "*" + offset_dtype if v == "O" else v) for k, v in names_types.items()}


_INTS = {"T": "i32", "C": "i32", "H": "i32", "D": "i32", "l_max": "i32", "r_max": "i32", "max_offset": "fp32"}


def _spec_prefix(K, dtype, C, H):
    block_t, block_c = _prefix_blocks(C)
    sig = _sig({"x_ptr": "X", "s_ptr": "*fp32", "T": "i32", "C": "i32", "inv_norm": "fp32",
                "BLOCK_T": "constexpr", "BLOCK_C": "constexpr"}, dtype)
    return sig, {"BLOCK_T": block_t, "BLOCK_C": block_c}, _NUM_WARPS


def _spec(kind: str, causal: bool):
    def build(K, dtype, C, H):
        block_t, block_d = _blocks(C // H)
        if kind == "fwd":
            ptrs = {"s_ptr": "*fp32", "left_ptr": "O", "right_ptr": "O", "y_ptr": "X"}
            extra = {}
        elif kind == "bwd_input":
            ptrs = {"dy_ptr": "X", "left_ptr": "O", "right_ptr": "O", "dx_ptr": "X"}
            extra = {"inv_norm": "fp32", "reach_l": "i32", "reach_r": "i32"}
        else:
            ptrs = {"dy_ptr": "X", "x_ptr": "X", "left_ptr": "O", "right_ptr": "O", "dleft_ptr": "*fp32",
                    "dright_ptr": "*fp32"}
            extra = {"inv_norm": "fp32"}
        sig = _sig({**ptrs, **_INTS, **extra, "CAUSAL": "constexpr", "BLOCK_T": "constexpr",
                    "BLOCK_D": "constexpr"}, dtype)
        return sig, {"CAUSAL": causal, "BLOCK_T": block_t, "BLOCK_D": block_d}, _NUM_WARPS

    return build


# The window size is a runtime argument (no K constexpr): one compile serves every kernel size.
KERNELS = [KernelSpec("talk_prefix", talk_prefix_kernel, _spec_prefix, "fp32 summed-area table", k_constexpr=False)]
for _kind, _fn in (("fwd", talk_fwd_kernel), ("bwd_input", talk_bwd_input_kernel),
                   ("bwd_offsets", talk_bwd_offsets_kernel)):
    for _causal in (False, True):
        KERNELS.append(KernelSpec(f"talk_{_kind}_{'dec' if _causal else 'enc'}", _fn, _spec(_kind, _causal),
                                  k_constexpr=False))
