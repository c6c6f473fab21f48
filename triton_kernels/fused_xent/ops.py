"""Fused output projection + label-smoothed cross-entropy as torch ops backed by Triton.

Public: ``fused_label_smoothed_loss(features, weight, target, epsilon, ignore_index) -> (loss_sum, nll_sum)``;
the registered ops ``torch.ops.seqmix.fused_xent_forward`` / ``fused_xent_backward``; ``KERNELS`` (AOT specs).

The (N, V) logits are never stored: the forward keeps per-row lse / loss / nll (3·N fp32), the backward
recomputes logit tiles. grad_weight comes from its own kernel over vocabulary blocks rather than atomics
from the row-block kernel: atomics would make it nondeterministic run to run and put N / BLOCK_M
contending fp32 adds on every weight element; the cost is recomputing the logits in both backward kernels.
"""

from __future__ import annotations

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
from triton_kernels.fused_xent.kernels import (
    fused_xent_bwd_features_kernel,
    fused_xent_bwd_weight_kernel,
    fused_xent_fwd_kernel,
)

__all__ = ["fused_label_smoothed_loss", "fused_xent_forward", "fused_xent_backward", "KERNELS"]

_NUM_WARPS = 8


def _blocks(dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_V, BLOCK_K, BLOCK_D), 8 warps. fp16/bf16: 64x64 logit tiles beside a 64-wide gradient
    accumulator (at most 178 registers, AOT sm_80/sm_90, also with unaligned inputs; 4 warps reached 255).
    fp32 loads twice the bytes per tile and spilled at that size: 32 rows, 32-wide gradient blocks."""
    return (32, 64, 16, 32) if dtype == torch.float32 else (64, 64, 32, 64)


def _validate(features, weight, target, epsilon, ignore_index) -> tuple[int, int, int]:
    check_tensor("features", features, 2)
    check_tensor("weight", weight, 2)
    if not isinstance(target, torch.Tensor) or target.ndim != 1 or target.dtype not in (torch.int64, torch.int32):
        raise TypeError("target must be a 1-dim int64/int32 tensor")
    N, C = features.shape
    V, C_w = weight.shape
    if C_w != C:
        raise ValueError(f"weight must be (V, C={C}), got {tuple(weight.shape)}")
    if target.shape[0] != N:
        raise ValueError(f"target has {target.shape[0]} entries but features has {N} rows")
    if V < 2:
        raise ValueError(f"label smoothing needs a vocabulary of at least 2, got V={V}")
    if weight.dtype != features.dtype:
        raise TypeError(f"weight is {weight.dtype} but features is {features.dtype}; cast them alike (or use autocast)")
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must be a float in [0, 1), got {epsilon!r}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"ignore_index must be an int, got {type(ignore_index).__name__}")
    check_device(features, ("weight", weight), ("target", target))
    return N, V, C


def _coefs(epsilon: float, V: int) -> tuple[float, float]:
    """(1 - eps - eps_i, eps_i) with eps_i = eps / (V - 1) (fairseq's smoothing mass per wrong class)."""
    eps_i = epsilon / (V - 1)
    return 1.0 - epsilon - eps_i, eps_i


def _launch_forward(features, weight, target, epsilon, ignore_index, blocks=None):
    """Per-row (loss, nll, lse) in fp32. ``blocks`` overrides (BLOCK_M, BLOCK_V, BLOCK_K, BLOCK_D) for tests."""
    N, V, C = _validate(features, weight, target, epsilon, ignore_index)
    loss, nll, lse = (new_output((N,), torch.float32, features.device) for _ in range(3))
    if N == 0:
        return loss, nll, lse
    block_m, block_v, block_k, _ = blocks or _blocks(features.dtype)
    smooth_coef, eps_i = _coefs(epsilon, V)
    wrap_triton(fused_xent_fwd_kernel)[(triton.cdiv(N, block_m),)](
        features, weight, target, lse, loss, nll, N, V, C, ignore_index, smooth_coef, eps_i,
        UPCAST=interpreting() or features.dtype == torch.float32,
        BLOCK_M=block_m, BLOCK_V=block_v, BLOCK_K=block_k, num_warps=_NUM_WARPS,
    )
    return loss, nll, lse


def _launch_backward(g_loss, g_nll, features, weight, target, lse, epsilon, ignore_index, blocks=None):
    """(d features, d weight) for per-row upstream gradients g_loss, g_nll (fp32, (N,))."""
    N, V, C = _validate(features, weight, target, epsilon, ignore_index)
    df = new_output(features.shape, features.dtype, features.device)
    dw = new_output(weight.shape, weight.dtype, weight.device)
    if N == 0 or C == 0:
        return df.zero_(), dw.zero_()
    block_m, block_v, block_k, block_d = blocks or _blocks(features.dtype)
    smooth_coef, eps_i = _coefs(epsilon, V)
    args = (features, weight, target, lse, g_loss, g_nll)
    scalars = (N, V, C, ignore_index, smooth_coef, eps_i)
    meta = dict(UPCAST=interpreting() or features.dtype == torch.float32, BLOCK_M=block_m, BLOCK_V=block_v,
                BLOCK_K=block_k, BLOCK_D=block_d, num_warps=_NUM_WARPS)
    n_d = triton.cdiv(C, block_d)
    wrap_triton(fused_xent_bwd_features_kernel)[(triton.cdiv(N, block_m), n_d)](*args, df, *scalars, **meta)
    wrap_triton(fused_xent_bwd_weight_kernel)[(triton.cdiv(V, block_v), n_d)](*args, dw, *scalars, **meta)
    return df, dw


def _forward_body(features: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, epsilon: float,
                  ignore_index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _launch_forward(features.contiguous(), weight.contiguous(), target.contiguous(), epsilon, ignore_index)


def _forward_fake(features, weight, target, epsilon, ignore_index):
    N, _, _ = _validate(features, weight, target, epsilon, ignore_index)
    return tuple(features.new_empty((N,), dtype=torch.float32) for _ in range(3))


def _backward_body(g_loss: torch.Tensor, g_nll: torch.Tensor, features: torch.Tensor, weight: torch.Tensor,
                   target: torch.Tensor, lse: torch.Tensor, epsilon: float, ignore_index: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch_backward(g_loss.float().contiguous(), g_nll.float().contiguous(), features.contiguous(),
                            weight.contiguous(), target.contiguous(), lse.contiguous(), epsilon, ignore_index)


def _backward_fake(g_loss, g_nll, features, weight, target, lse, epsilon, ignore_index):
    _validate(features, weight, target, epsilon, ignore_index)
    return (torch.empty_like(features, memory_format=torch.contiguous_format),
            torch.empty_like(weight, memory_format=torch.contiguous_format))


fused_xent_forward = define_op("seqmix::fused_xent_forward", _forward_body, _forward_fake)
fused_xent_backward = define_op("seqmix::fused_xent_backward", _backward_body, _backward_fake)


def _setup_context(ctx, inputs, output) -> None:
    features, weight, target, epsilon, ignore_index = inputs
    ctx.save_for_backward(features, weight, target, output[2])
    ctx.epsilon, ctx.ignore_index = epsilon, ignore_index


def _autograd_backward(ctx, g_loss, g_nll, _g_lse):
    """The lse output is internal (never returned by the public function), so its gradient is ignored."""
    features, weight, target, lse = ctx.saved_tensors
    g_loss = torch.zeros_like(lse) if g_loss is None else g_loss
    g_nll = torch.zeros_like(lse) if g_nll is None else g_nll
    df, dw = fused_xent_backward(g_loss, g_nll, features, weight, target, lse, ctx.epsilon, ctx.ignore_index)
    return df, dw, None, None, None


fused_xent_forward.register_autograd(_autograd_backward, setup_context=_setup_context)


def fused_label_smoothed_loss(features: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                              epsilon: float, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed (loss, nll) of logits = features @ weight.T over targets != ignore_index, as 0-dim fp32 tensors.

    fairseq's label smoothing: loss = (1 - eps - eps_i)·nll + eps_i·sum_v(-log p_v), eps_i = eps / (V - 1).
    features (N, C), weight (V, C) (same dtype; fp32 accumulation), target (N,) int64/int32 in [0, V) or
    ignore_index (out-of-range targets are not checked on the device). Under autocast features and weight
    are cast to the autocast dtype. Differentiable in features and weight.
    """
    _validate(features, weight, target, epsilon, ignore_index)
    features, weight = autocast_inputs(features, weight)
    loss, nll, _ = fused_xent_forward(features, weight, target, float(epsilon), ignore_index)
    return loss.sum(), nll.sum()


def _spec(kind: str):
    """AOT signature of one kernel as the op launches it; the model width only enters through divisibility."""

    def build(K, dtype, C, H):
        ty = "*" + triton_type(dtype)
        block_m, block_v, block_k, block_d = _blocks(dtype)
        grads = {} if kind == "fwd" else {"gl_ptr": "*fp32", "gn_ptr": "*fp32"}
        outs = ({"loss_ptr": "*fp32", "nll_ptr": "*fp32"} if kind == "fwd"
                else {("df_ptr" if kind == "features" else "dw_ptr"): ty})
        sig = {"f_ptr": ty, "w_ptr": ty, "t_ptr": "*i64", "lse_ptr": "*fp32", **grads, **outs,
               "N": "i32", "V": "i32", "C": "i32", "ignore_index": "i32", "smooth_coef": "fp32", "eps_i": "fp32",
               "UPCAST": "constexpr", "BLOCK_M": "constexpr", "BLOCK_V": "constexpr", "BLOCK_K": "constexpr"}
        consts = {"UPCAST": dtype == torch.float32, "BLOCK_M": block_m, "BLOCK_V": block_v, "BLOCK_K": block_k}
        if kind != "fwd":
            sig["BLOCK_D"] = "constexpr"
            consts["BLOCK_D"] = block_d
        return sig, consts, _NUM_WARPS

    return build


# Sizes are runtime arguments: one compile per dtype covers every vocabulary and width (k_constexpr=False).
KERNELS = [
    KernelSpec("fused_xent_fwd", fused_xent_fwd_kernel, _spec("fwd"), "per-row lse/loss/nll", k_constexpr=False),
    KernelSpec("fused_xent_bwd_features", fused_xent_bwd_features_kernel, _spec("features"),
               "d features per (row block, channel block)", k_constexpr=False),
    KernelSpec("fused_xent_bwd_weight", fused_xent_bwd_weight_kernel, _spec("weight"),
               "d weight per (vocab block, channel block), no atomics", k_constexpr=False),
]
