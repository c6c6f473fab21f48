"""LightConv and DynamicConv Triton kernels under the interpreter vs. their float64 references (y, dx, dw).

One module for both ops: they share the call ``op(x, weight, padding_l)`` and differ in the weight's shape —
LightConv (H, K) shared over batch and time, DynamicConv (B, T, H, K) per position — and in how the weight
gradient is reduced (over batch and time vs. per position).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch

from tests.kernels.checks import assert_close, pad_tail
from triton_kernels import common
from triton_kernels.dynamicconv import dynamicconv
from triton_kernels.dynamicconv import ops as dc_ops
from triton_kernels.dynamicconv.reference import dynamicconv_reference, dynamicconv_reference_grads
from triton_kernels.lightconv import lightconv
from triton_kernels.lightconv import ops as lc_ops
from triton_kernels.lightconv.reference import lightconv_reference, lightconv_reference_grads

pytestmark = pytest.mark.interpret


@dataclass(frozen=True)
class Op:
    fn: Any
    ops: Any
    reference: Any
    reference_grads: Any
    per_position: bool  # weight (B, T, H, K) instead of (H, K)

    def weight_shape(self, B: int, T: int, H: int, K: int) -> tuple[int, ...]:
        return (B, T, H, K) if self.per_position else (H, K)


OPS = {
    "lightconv": Op(lightconv, lc_ops, lightconv_reference, lightconv_reference_grads, per_position=False),
    "dynamicconv": Op(dynamicconv, dc_ops, dynamicconv_reference, dynamicconv_reference_grads, per_position=True),
}


@pytest.fixture(params=sorted(OPS))
def op(request) -> Op:
    return OPS[request.param]


def _inputs(op: Op, B, T, C, H, K, dtype, wdtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g).to(dtype)
    w = torch.softmax(torch.randn(op.weight_shape(B, T, H, K), generator=g), dim=-1).to(wdtype or dtype)
    dy = torch.randn(B, T, C, generator=g).to(dtype)
    return x, w, dy


def _check(op: Op, x, w, dy, padding_l, dtype, **launch):
    """Forward and both gradients through autograd (or the private launchers when `launch` is set)."""
    if launch:
        y = op.ops._launch_forward(x, w, padding_l, launch["blocks"])
        dx, dw = op.ops._launch_backward(dy, x, w, padding_l, **launch)
    else:
        xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        y = op.fn(xg, wg, padding_l)
        y.backward(dy)
        dx, dw = xg.grad, wg.grad
    assert y.dtype == x.dtype and dx.dtype == x.dtype and dw.dtype == w.dtype
    y_ref, dx_ref, dw_ref = op.reference_grads(x, w, padding_l, dy)
    assert_close("y", y, y_ref, dtype)
    assert_close("dx", dx, dx_ref, dtype)
    assert_close("dw", dw, dw_ref, dtype if w.dtype == dtype else torch.float32)


@pytest.mark.parametrize("T", [1, 5, 17, 64])
@pytest.mark.parametrize("K", [3, 7, 15, 31])
@pytest.mark.parametrize("causal", [False, True], ids=["enc", "dec"])
def test_fp32(op, T, K, causal):
    x, w, dy = _inputs(op, 2, T, 24, 2, K, torch.float32, seed=T * 100 + K)  # C/H = 12
    _check(op, x, w, dy, K - 1 if causal else K // 2, torch.float32)


@pytest.mark.parametrize(
    "T,K,padding_l,C,H",
    [(64, 31, 15, 64, 4), (17, 15, 14, 36, 3), (5, 7, 3, 16, 16), (1, 3, 2, 8, 1), (17, 31, 0, 20, 5)],
)
def test_fp16(op, T, K, padding_l, C, H):
    x, w, dy = _inputs(op, 2, T, C, H, K, torch.float16, seed=K)
    _check(op, x, w, dy, padding_l, torch.float16)


@pytest.mark.parametrize("T,K,padding_l", [(17, 7, 6), (64, 15, 7)])
def test_bf16(op, T, K, padding_l):
    """bf16 works in the interpreter because the kernels upcast at load."""
    x, w, dy = _inputs(op, 2, T, 24, 4, K, torch.bfloat16, seed=K)
    _check(op, x, w, dy, padding_l, torch.bfloat16)


@pytest.mark.parametrize("K,padding_l", [(1, 0), (2, 1), (4, 3), (9, 0), (16, 8), (63, 31), (63, 62)])
def test_kernel_sizes(op, K, padding_l):
    """Odd/even K from 1 to 63 with every kind of padding, K much larger than T."""
    x, w, dy = _inputs(op, 1, 5, 8, 2, K, torch.float32, seed=K)
    _check(op, x, w, dy, padding_l, torch.float32)


def test_mixed_dtypes_fp16_x_fp32_weight(op):
    x, w, dy = _inputs(op, 2, 17, 24, 4, 7, torch.float16, wdtype=torch.float32)
    _check(op, x, w, dy, 3, torch.float16)


@pytest.mark.parametrize(
    "T,K,padding_l,C,H,blocks",
    [(40, 31, 30, 40, 1, (16, 16)), (40, 31, 15, 24, 4, (16, 16)), (17, 15, 7, 48, 2, (8, 16))],
)
def test_block_edges(op, T, K, padding_l, C, H, blocks):
    """Small blocks: several (partial) time and channel blocks, K > BLOCK_T, heads wider than a block
    (C/H = 40 -> 16+16+8, 24 -> 16+8) and narrower than one (C/H = 6, straddling channel blocks)."""
    x, w, dy = _inputs(op, 1, T, C, H, K, torch.float32, seed=7)
    _check(op, x, w, dy, padding_l, torch.float32, blocks=blocks)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_lightconv_weight_gradient_chunks(steps):
    """LightConv's weight gradient is reduced over time in chunks of `steps` blocks, then on the host."""
    op = OPS["lightconv"]
    x, w, dy = _inputs(op, 2, 40, 24, 4, 31, torch.float32, seed=steps)
    _check(op, x, w, dy, 15, torch.float32, blocks=(8, 16), steps=steps)


@pytest.mark.parametrize("causal", [False, True], ids=["enc", "dec"])
def test_padded_batch(op, causal):
    """Rows with a zero tail: matches the reference and, on the valid prefix, the unpadded row."""
    K, T = 7, 17
    p = K - 1 if causal else K // 2
    x, w, dy = _inputs(op, 2, T, 24, 4, K, torch.float32, seed=3)
    x, dy = pad_tail(x, [T, 9]), pad_tail(dy, [T, 9])
    _check(op, x, w, dy, p, torch.float32)
    y = op.fn(x, w, p)
    w_short = w[1:, :9].contiguous() if op.per_position else w
    y_short = op.fn(x[1:, :9].contiguous(), w_short, p)
    torch.testing.assert_close(y[1, :9], y_short[0], rtol=1e-6, atol=1e-6)


def test_non_contiguous_inputs(op):
    x, w, _ = _inputs(op, 2, 17, 24, 4, 7, torch.float32)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)
    wt = w.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not xt.is_contiguous() and not wt.is_contiguous()
    assert_close("y", op.fn(xt, wt, 3), op.reference(x.double(), w.double(), 3), torch.float32)


def test_empty_batch(op):
    x = torch.zeros(0, 5, 8, requires_grad=True)
    w = torch.zeros(op.weight_shape(0, 5, 2, 3), requires_grad=True)
    y = op.fn(x, w, 1)
    assert y.shape == (0, 5, 8)
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and not w.grad.any()


def test_outputs_nan_filled_under_interpreter():
    assert common.interpreting() and common.nan_fill_outputs()
    assert torch.isnan(common.new_output((3,), torch.float16, torch.device("cpu"))).all()


def test_autocast_runs_in_autocast_dtype(op):
    x, w, dy = _inputs(op, 2, 17, 24, 4, 7, torch.float32)
    wp = w.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.float16):
        y = op.fn(x, wp, 3)
    assert y.dtype == torch.float16
    y.backward(dy.half())
    assert wp.grad.dtype == torch.float32
    assert_close("y", y, op.reference(x.half().double(), w.half().double(), 3), torch.float16)


def test_torch_compile_traces_through_op(op):
    """Taps from a Linear + softmax in PyTorch (per position for DynamicConv), then the op; aot_eager on CPU."""
    B, T, C, H, K, p = 2, 17, 24, 4, 7, 6
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, C, generator=g)
    lin = torch.randn(H * K, C, generator=g) * 0.2
    dy = torch.randn(B, T, C, generator=g)

    def taps(x, lin):
        logits = (x @ lin.t()).view(B, T, H, K) if op.per_position else lin.sum(-1).view(H, K)
        return torch.softmax(logits, dim=-1)

    xg, lg = x.clone().requires_grad_(True), lin.clone().requires_grad_(True)
    out = torch.compile(lambda a, b: op.fn(a * 2, taps(a, b), p), backend="aot_eager", fullgraph=True)(xg, lg)
    out.backward(dy)
    xr, lr = x.double().requires_grad_(True), lin.double().requires_grad_(True)
    ref = op.reference(xr * 2, taps(xr, lr), p)
    ref.backward(dy.double())
    assert_close("y", out, ref, torch.float32)
    assert_close("dx", xg.grad, xr.grad, torch.float32)
    assert_close("dlin", lg.grad, lr.grad, torch.float32)


def _errors(weight_dims: int, per_position: bool):
    def w(H=4, K=3, **kw):
        return torch.zeros(*((2, 5) if per_position else ()), H, K, **kw)

    return [
        (lambda: (torch.zeros(2, 5), w(), 1), ValueError, "x must have 3 dims"),
        (lambda: (torch.zeros(2, 5, 8), w().unsqueeze(0), 1), ValueError, f"weight must have {weight_dims} dims"),
        (lambda: (torch.zeros(2, 5, 10), w(), 1), ValueError, "divisible"),
        (lambda: (torch.zeros(2, 5, 8), w(), 3), ValueError, "padding_l=3 out of range"),
        (lambda: (torch.zeros(2, 5, 8), w(), -1), ValueError, "out of range"),
        (lambda: (torch.zeros(2, 5, 8), w(), True), TypeError, "padding_l must be an int"),
        (lambda: (torch.zeros(2, 5, 8), w(), 1.0), TypeError, "padding_l must be an int"),
        (lambda: (torch.zeros(2, 5, 8), w(K=common.MAX_K + 1), 0), ValueError, "kernel size"),
        (lambda: (torch.zeros(2, 5, 8, dtype=torch.float64), w(), 1), TypeError, "dtype"),
        (lambda: (torch.zeros(2, 5, 8), w(dtype=torch.int32), 1), TypeError, "dtype"),
        (lambda: ([[0.0]], w(), 1), TypeError, "torch.Tensor"),
        (lambda: (torch.zeros(2, 5, 8, device="meta"), w(device="meta"), 1), ValueError, "CUDA"),
    ]


@pytest.mark.parametrize("name,make,exc,match",
                         [("lightconv", *e) for e in _errors(2, False)] + [("dynamicconv", *e) for e in _errors(4, True)]
                         + [("dynamicconv", lambda: (torch.zeros(2, 5, 8), torch.zeros(2, 4, 4, 3), 1), ValueError,
                             r"\(B, T, H, K\)")])
def test_clear_errors(name, make, exc, match):
    x, w, p = make()
    with pytest.raises(exc, match=match):
        OPS[name].fn(x, w, p)


def test_cpu_without_interpreter_raises(op, monkeypatch):
    monkeypatch.setattr(common, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="CUDA"):
        op.fn(torch.zeros(1, 4, 8), torch.zeros(op.weight_shape(1, 4, 2, 3)), 1)
