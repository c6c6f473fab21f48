"""LightConv as torch ops backed by Triton: forward, backward (dx, dw), autograd, AMP, AOT specs.

Public: `lightconv(x, weight, padding_l)`; the registered ops `torch.ops.seqmix.lightconv_forward`
and `torch.ops.seqmix.lightconv_backward`; `KERNELS` (AOT signatures for tests/kernels).
Weights arrive normalized (softmax / DropConnect are the caller's, in PyTorch).
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
from triton_kernels.lightconv.kernels import lightconv_bwd_weight_kernel, lightconv_fwd_kernel

__all__ = ["lightconv", "lightconv_forward", "lightconv_backward", "KERNELS"]

_NUM_WARPS = 8
_MAX_STEPS = 8  # time blocks per weight-gradient program: fewer partial rows vs. more programs


def _blocks(C: int) -> tuple[int, int]:
    """(BLOCK_T, BLOCK_C): ~2048-element fp32 tiles; depends on C only below 64 channels."""
    block_c = clamp_block(C, 16, 64)
    return min(64, 2048 // block_c), block_c


def _steps(T: int, block_t: int) -> int:
    return max(1, min(triton.cdiv(T, block_t), _MAX_STEPS))


def _validate(x, weight, padding_l) -> tuple[int, int, int, int, int]:
    check_tensor("x", x, 3)
    check_tensor("weight", weight, 2)
    check_device(x, ("weight", weight))
    B, T, C = x.shape
    H, K = weight.shape
    check_kernel_size(K)
    check_padding(padding_l, K)
    D = check_heads(C, H)
    check_int32("T*C", T * C)
    return B, T, C, H, D


def _launch_forward(
    x: torch.Tensor, weight: torch.Tensor, padding_l: int, blocks: tuple[int, int] | None = None
) -> torch.Tensor:
    """`blocks` overrides (BLOCK_T, BLOCK_C); tests use it to hit block edges with tiny shapes."""
    B, T, C, H, D = _validate(x, weight, padding_l)
    K = weight.shape[1]
    y = new_output(x.shape, x.dtype, x.device)
    if y.numel() == 0:
        return y
    block_t, block_c = blocks or _blocks(C)
    grid = (B * triton.cdiv(T, block_t), triton.cdiv(C, block_c))
    wrap_triton(lightconv_fwd_kernel)[grid](
        x, weight, y, T, C, D, padding_l,
        K=K, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=_NUM_WARPS,
    )
    return y


def _launch_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    padding_l: int,
    blocks: tuple[int, int] | None = None,
    steps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    B, T, C, H, D = _validate(x, weight, padding_l)
    K = weight.shape[1]
    if dy.shape != x.shape:
        raise ValueError(f"grad_output shape {tuple(dy.shape)} != x shape {tuple(x.shape)}")
    # dx is the forward conv of dy with the taps reversed and the padding mirrored:
    # dx[t] = sum_k w[k] dy[t - k + p] = sum_j w[K-1-j] dy[t + j - (K-1-p)].
    dx = _launch_forward(dy, weight.flip(1).contiguous(), K - 1 - padding_l, blocks)
    if x.numel() == 0:
        return dx, torch.zeros_like(weight)
    block_t, block_c = blocks or _blocks(C)
    steps = steps or _steps(T, block_t)
    n_chunks = triton.cdiv(T, block_t * steps)
    part = new_output((B * n_chunks, K, C), torch.float32, x.device)
    grid = (B * n_chunks, triton.cdiv(C, block_c))
    wrap_triton(lightconv_bwd_weight_kernel)[grid](
        dy, x, part, T, C, padding_l, steps,
        K=K, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=_NUM_WARPS,
    )
    # Deterministic second stage: chunks and the head's channels, in fp32.
    dw = part.view(B * n_chunks, K, H, D).sum(dim=(0, 3)).t().contiguous()
    return dx, dw.to(weight.dtype)


lightconv = register_conv_op("lightconv", _validate, _launch_forward, _launch_backward, """y[b,t,c] = sum_k weight[c // (C//H), k] * x[b, t+k-padding_l, c], x: (B,T,C), weight: (H,K).

    Encoder: padding_l = K//2; decoder (causal): padding_l = K-1. Output in x.dtype, fp32 accumulation.
    Under autocast (CUDA, or CPU while interpreting) x and weight are cast to the autocast dtype first.
    Raises ValueError/TypeError for anything the kernels do not support.
    """)
lightconv_forward, lightconv_backward = lightconv.forward_op, lightconv.backward_op


def _spec_forward(K: int, dtype: torch.dtype, C: int, H: int):
    block_t, block_c = _blocks(C)
    ty = "*" + triton_type(dtype)
    sig = {
        "x_ptr": ty, "w_ptr": ty, "y_ptr": ty,
        "T": "i32", "C": "i32", "D": "i32", "padding_l": "i32",
        "K": "constexpr", "BLOCK_T": "constexpr", "BLOCK_C": "constexpr",
    }
    return sig, {"K": K, "BLOCK_T": block_t, "BLOCK_C": block_c}, _NUM_WARPS


def _spec_bwd_weight(K: int, dtype: torch.dtype, C: int, H: int):
    block_t, block_c = _blocks(C)
    ty = "*" + triton_type(dtype)
    sig = {
        "dy_ptr": ty, "x_ptr": ty, "part_ptr": "*fp32",
        "T": "i32", "C": "i32", "padding_l": "i32", "steps": "i32",
        "K": "constexpr", "BLOCK_T": "constexpr", "BLOCK_C": "constexpr",
    }
    return sig, {"K": K, "BLOCK_T": block_t, "BLOCK_C": block_c}, _NUM_WARPS


KERNELS = [
    KernelSpec("lightconv_fwd", lightconv_fwd_kernel, _spec_forward,
               "forward; also backward-input (reversed taps)"),
    KernelSpec("lightconv_bwd_weight", lightconv_bwd_weight_kernel, _spec_bwd_weight,
               "per-chunk partial dw, summed on the host"),
]
