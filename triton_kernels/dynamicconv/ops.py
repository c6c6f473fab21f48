"""DynamicConv as torch ops backed by Triton: forward, backward (dx, dw), autograd, AMP, AOT specs.

Public: `dynamicconv(x, weight, padding_l)`; the registered ops `torch.ops.seqmix.dynamicconv_forward`
and `torch.ops.seqmix.dynamicconv_backward`; `KERNELS` (AOT signatures for tests/kernels).
`weight` is (B, T, H, K), already normalized by the caller (softmax over K, DropConnect in PyTorch):
the softmax is not fused here (no GPU to show it pays; see the kernels' notes).
"""

from __future__ import annotations

import torch
import triton
from torch.library import wrap_triton

from triton_kernels.common import (
    KernelSpec,
    check_device,
    check_heads,
    check_int32,
    check_kernel_size,
    check_padding,
    check_tensor,
    clamp_block,
    new_output,
    register_conv_op,
    triton_type,
)
from triton_kernels.dynamicconv.kernels import (
    dynamicconv_bwd_input_kernel,
    dynamicconv_bwd_weight_kernel,
    dynamicconv_fwd_kernel,
)

__all__ = ["dynamicconv", "dynamicconv_forward", "dynamicconv_backward", "KERNELS"]

_NUM_WARPS = 8
_BLOCK_T = 64


def _block_d(D: int) -> int:
    """Channels of one head per program: 32 (16 for heads narrower than 17 channels)."""
    return clamp_block(D, 16, 32)


def _validate(x, weight, padding_l) -> tuple[int, int, int, int, int, int]:
    check_tensor("x", x, 3)
    check_tensor("weight", weight, 4)
    check_device(x, ("weight", weight))
    B, T, C = x.shape
    if tuple(weight.shape[:2]) != (B, T):
        raise ValueError(f"weight must be (B, T, H, K) = ({B}, {T}, H, K), got {tuple(weight.shape)}")
    H, K = weight.shape[2], weight.shape[3]
    check_kernel_size(K)
    check_padding(padding_l, K)
    D = check_heads(C, H)
    check_int32("T*C", T * C)
    check_int32("T*H*K", T * H * K)
    return B, T, C, H, K, D


def _launch_forward(
    x: torch.Tensor, weight: torch.Tensor, padding_l: int, blocks: tuple[int, int] | None = None
) -> torch.Tensor:
    """`blocks` overrides (BLOCK_T, BLOCK_D); tests use it to hit block edges with tiny shapes."""
    B, T, C, H, K, D = _validate(x, weight, padding_l)
    y = new_output(x.shape, x.dtype, x.device)
    if y.numel() == 0:
        return y
    block_t, block_d = blocks or (_BLOCK_T, _block_d(D))
    grid = (B * triton.cdiv(T, block_t) * H * triton.cdiv(D, block_d),)
    wrap_triton(dynamicconv_fwd_kernel)[grid](
        x, weight, y, T, C, H, D, padding_l,
        K=K, BLOCK_T=block_t, BLOCK_D=block_d, num_warps=_NUM_WARPS,
    )
    return y


def _launch_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    padding_l: int,
    blocks: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, C, H, K, D = _validate(x, weight, padding_l)
    if dy.shape != x.shape:
        raise ValueError(f"grad_output shape {tuple(dy.shape)} != x shape {tuple(x.shape)}")
    dx = new_output(x.shape, x.dtype, x.device)
    dw = new_output(weight.shape, weight.dtype, x.device)
    if x.numel() == 0:
        return dx, dw.zero_()
    block_t, block_d = blocks or (_BLOCK_T, _block_d(D))
    n_tb = triton.cdiv(T, block_t)
    wrap_triton(dynamicconv_bwd_input_kernel)[(B * n_tb * H * triton.cdiv(D, block_d),)](
        dy, weight, dx, T, C, H, D, padding_l,
        K=K, BLOCK_T=block_t, BLOCK_D=block_d, num_warps=_NUM_WARPS,
    )
    wrap_triton(dynamicconv_bwd_weight_kernel)[(B * n_tb * H,)](
        dy, x, dw, T, C, H, D, padding_l,
        K=K, BLOCK_T=block_t, BLOCK_D=block_d, num_warps=_NUM_WARPS,
    )
    return dx, dw


dynamicconv = register_conv_op("dynamicconv", _validate, _launch_forward, _launch_backward, """y[b,t,c] = sum_k weight[b,t,c // (C//H),k] * x[b,t+k-padding_l,c], x: (B,T,C), weight: (B,T,H,K).

    Encoder: padding_l = K//2; decoder (causal): padding_l = K-1. Output in x.dtype, fp32 accumulation.
    Under autocast (CUDA, or CPU while interpreting) x and weight are cast to the autocast dtype first.
    Raises ValueError/TypeError for anything the kernels do not support.
    """)
dynamicconv_forward, dynamicconv_backward = dynamicconv.forward_op, dynamicconv.backward_op


def _signature(ty: str, names: tuple[str, str, str], out_ty: str) -> dict[str, str]:
    a, b, c = names
    return {
        a: ty, b: ty, c: out_ty,
        "T": "i32", "C": "i32", "H": "i32", "D": "i32", "padding_l": "i32",
        "K": "constexpr", "BLOCK_T": "constexpr", "BLOCK_D": "constexpr",
    }


def _spec(names: tuple[str, str, str]):
    def build(K: int, dtype: torch.dtype, C: int, H: int):
        ty = "*" + triton_type(dtype)
        consts = {"K": K, "BLOCK_T": _BLOCK_T, "BLOCK_D": _block_d(C // H)}
        return _signature(ty, names, ty), consts, _NUM_WARPS

    return build


KERNELS = [
    KernelSpec("dynamicconv_fwd", dynamicconv_fwd_kernel, _spec(("x_ptr", "w_ptr", "y_ptr")), "forward"),
    KernelSpec("dynamicconv_bwd_input", dynamicconv_bwd_input_kernel, _spec(("dy_ptr", "w_ptr", "dx_ptr")),
               "dx (gather form of the transposed conv)"),
    KernelSpec("dynamicconv_bwd_weight", dynamicconv_bwd_weight_kernel, _spec(("dy_ptr", "x_ptr", "dw_ptr")),
               "dw, one program per (b, time block, head)"),
]
