"""The ConvS2S decoder step as a torch op backed by Triton: forward kernel, autograd, AMP, AOT specs.

Public: ``convs2s_step(window, weight, bias, residual=None)``; the registered op
``torch.ops.seqmix.convs2s_step_forward``; ``KERNELS`` (AOT signatures for tests/kernels).

It serves incremental decoding: per layer and step it replaces unfold + addmm + GLU [+ add + scale] (three
to five launches, and two passes over the 2·C_out pre-activations) by one launch; the caller keeps the
window update (one cat) and folds the weight norm once per decode. The backward is plain PyTorch (one
recomputed matmul): correct under autograd, not tuned, as training runs the full-sequence convolution.
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
    check_tensor,
    define_op,
    interpreting,
    new_output,
    triton_type,
)
from triton_kernels.convs2s.kernels import convs2s_step_kernel

__all__ = ["convs2s_step", "convs2s_step_forward", "KERNELS"]

SQRT_HALF = math.sqrt(0.5)
_NUM_WARPS = 4
_DECODE_ROWS = 16  # at most this many rows (sentences x beams x new steps): the decode-sized tiles


def _blocks(rows: int, aligned: bool, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K). Few rows (decoding a handful of beams) is a matrix-vector product bound by
    reading the weight: narrow channel blocks give more programs to read it, long reduction blocks more bytes
    in flight per program. Many rows: wider tiles so each weight tile is reused by 64 rows (fp32 with a
    shorter reduction block: 64 spilled on sm_80). Unaligned inputs (odd widths) load element by element, one
    64-bit address each, so they get small tiles: the larger ones spill there (AOT, sm_80/sm_90)."""
    if not aligned:
        return 16, 16, 64
    if rows <= _DECODE_ROWS:
        return 16, 16, 128
    return (64, 32, 32) if dtype == torch.float32 else (64, 32, 64)


def _aligned(C_in: int, C_out: int, *tensors: torch.Tensor) -> bool:
    """What Triton's launcher specializes on: 16-byte-aligned pointers and channel counts divisible by 16
    (then every row's tap span starts aligned and loads vectorize). Storages are allocated aligned, so the
    storage offset decides; unlike data_ptr() it is also known on the fake tensors torch.compile traces."""
    return C_in % 16 == 0 and C_out % 16 == 0 and all(t.storage_offset() * t.element_size() % 16 == 0
                                                      for t in tensors)


def _validate(window, weight, bias, residual) -> tuple[int, int, int, int, int]:
    check_tensor("window", window, 3)
    check_tensor("weight", weight, 2)
    check_tensor("bias", bias, 1)
    B, W, C_in = window.shape
    two_out, KC = weight.shape
    if C_in < 1 or KC % C_in or KC == 0:
        raise ValueError(f"weight must be (2·C_out, k·C_in) with C_in = {C_in} (window's channels), "
                         f"got {tuple(weight.shape)}")
    if two_out % 2 or two_out == 0:
        raise ValueError(f"weight has {two_out} output rows; the GLU needs an even, nonzero count (2·C_out)")
    k, C_out = KC // C_in, two_out // 2
    if W < k:
        raise ValueError(f"window holds {W} steps but the kernel width is k = {k}; buffer the last k−1 inputs "
                         "(zeros before the sequence starts) in front of the new ones")
    n = W - k + 1
    if tuple(bias.shape) != (two_out,):
        raise ValueError(f"bias must be ({two_out},), got {tuple(bias.shape)}")
    others = [("weight", weight), ("bias", bias)]
    if residual is not None:
        check_tensor("residual", residual, 3)
        if tuple(residual.shape) != (B, n, C_out):
            raise ValueError(f"residual must be (B, new steps, C_out) = {(B, n, C_out)}, got {tuple(residual.shape)}")
        others.append(("residual", residual))
    for name, t in others:
        if t.dtype != window.dtype:
            raise TypeError(f"{name} is {t.dtype} but window is {window.dtype}; cast them alike (or use autocast)")
    check_device(window, *others)
    return B, W, C_in, C_out, k


def _launch_forward(window, weight, bias, residual, blocks=None) -> torch.Tensor:
    """``blocks`` overrides (BLOCK_M, BLOCK_N, BLOCK_K) (tests use it to cross tile edges with tiny shapes)."""
    B, W, C_in, C_out, k = _validate(window, weight, bias, residual)
    n = W - k + 1
    y = new_output((B, n, C_out), window.dtype, window.device)
    M = B * n
    if M == 0:
        return y
    aligned = _aligned(C_in, C_out, window, weight, bias, y, *([] if residual is None else [residual]))
    block_m, block_n, block_k = blocks or _blocks(M, aligned, window.dtype)
    grid = (triton.cdiv(M, block_m), triton.cdiv(C_out, block_n))
    wrap_triton(convs2s_step_kernel)[grid](
        window, weight, bias, y if residual is None else residual, y,
        M, n, W, C_in, C_out, k * C_in, SQRT_HALF,
        HAS_RESIDUAL=residual is not None, UPCAST=interpreting() or window.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=_NUM_WARPS,
    )
    return y


def _forward_body(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                  residual: torch.Tensor | None) -> torch.Tensor:
    return _launch_forward(window.contiguous(), weight.contiguous(), bias.contiguous(),
                           None if residual is None else residual.contiguous())


def _forward_fake(window, weight, bias, residual):
    B, W, C_in, C_out, k = _validate(window, weight, bias, residual)
    return window.new_empty((B, W - k + 1, C_out))


convs2s_step_forward = define_op("seqmix::convs2s_step_forward", _forward_body, _forward_fake)


def _setup_context(ctx, inputs, output) -> None:
    window, weight, bias, residual = inputs
    ctx.has_residual = residual is not None
    ctx.save_for_backward(window, weight, bias)


def _autograd_backward(ctx, dy):
    """GLU and matmul gradients in fp32 from one recomputed pre-activation; the window gradient adds each
    tap's slice back at its offset (steps overlap when several are decoded at once)."""
    window, weight, bias = ctx.saved_tensors
    B, W, C_in = window.shape
    KC = weight.shape[1]
    k = KC // C_in
    n = W - k + 1
    f32 = torch.promote_types(window.dtype, torch.float32)
    taps = window.contiguous().to(f32).as_strided((B, n, KC), (W * C_in, C_in, 1))
    h = torch.nn.functional.linear(taps, weight.to(f32), bias.to(f32))
    value, gate = h.chunk(2, dim=-1)
    s = torch.sigmoid(gate)
    dglu = dy.to(f32) * SQRT_HALF if ctx.has_residual else dy.to(f32)
    dh = torch.cat([dglu * s, dglu * value * s * (1 - s)], dim=-1)  # (B, n, 2·C_out)
    dweight = dh.reshape(-1, dh.size(-1)).T @ taps.reshape(-1, KC)
    dtaps = dh @ weight.to(f32)
    dwindow = window.new_zeros(window.shape, dtype=f32)
    for j in range(k):
        dwindow[:, j: j + n] += dtaps[..., j * C_in: (j + 1) * C_in]
    dresidual = (dy.to(f32) * SQRT_HALF).to(dy.dtype) if ctx.has_residual else None
    return (dwindow.to(window.dtype), dweight.to(weight.dtype), dh.sum(dim=(0, 1)).to(bias.dtype), dresidual)


convs2s_step_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def convs2s_step(window: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
    """GLU(linearized causal conv) for the newest W − k + 1 steps of ``window`` (B, W, C_in):
    y[b, i] = GLU(bias + weight · window[b, i : i+k].flatten()), weight (2·C_out, k·C_in) with column
    j·C_in + c (weight norm already folded), bias (2·C_out,); with ``residual`` (B, W−k+1, C_out):
    (y + residual)·√0.5. Output in the window's dtype, fp32 accumulation. Under autocast every input is
    cast to the autocast dtype."""
    _validate(window, weight, bias, residual)
    if residual is None:
        window, weight, bias = autocast_inputs(window, weight, bias)
    else:
        window, weight, bias, residual = autocast_inputs(window, weight, bias, residual)
    return convs2s_step_forward(window, weight, bias, residual)


def _spec(rows: int, aligned: bool, residual: bool):
    """AOT signature for a launch with ``rows`` rows; the model width only enters through divisibility."""

    def build(K, dtype, C, H):
        ty = "*" + triton_type(dtype)
        block_m, block_n, block_k = _blocks(rows, aligned, dtype)
        sig = {"x_ptr": ty, "w_ptr": ty, "b_ptr": ty, "r_ptr": ty, "y_ptr": ty, "M": "i32", "N_NEW": "i32",
               "W_LEN": "i32", "C_IN": "i32", "C_OUT": "i32", "KC": "i32", "res_scale": "fp32",
               "HAS_RESIDUAL": "constexpr", "UPCAST": "constexpr", "BLOCK_M": "constexpr",
               "BLOCK_N": "constexpr", "BLOCK_K": "constexpr"}
        consts = {"HAS_RESIDUAL": residual, "UPCAST": dtype == torch.float32, "BLOCK_M": block_m,
                  "BLOCK_N": block_n, "BLOCK_K": block_k}
        return sig, consts, _NUM_WARPS

    return build


# The kernel width k and the channel counts are runtime arguments: one compile per tile shape and epilogue.
# "generic" tiles are only launched on unaligned inputs, so they are AOT-compiled without divisibility.
KERNELS = [
    KernelSpec(f"convs2s_step_{size}{'_res' if res else ''}", convs2s_step_kernel, _spec(rows, aligned, res),
               f"{size} tiles{', residual epilogue' if res else ''}", k_constexpr=False)
    for size, rows, aligned in (("decode", 1, True), ("batch", _DECODE_ROWS + 1, True), ("generic", 1, False))
    for res in (False, True)
]
