"""LightConv Triton kernels under the interpreter vs. the float64 reference (forward, dx, dw)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.checks import assert_close, pad_tail
from triton_kernels import common
from triton_kernels.lightconv import lightconv
from triton_kernels.lightconv import ops as lc_ops
from triton_kernels.lightconv.reference import lightconv_reference, lightconv_reference_grads

pytestmark = pytest.mark.interpret


def _inputs(B, T, C, H, K, dtype, wdtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g).to(dtype)
    w = torch.softmax(torch.randn(H, K, generator=g), dim=-1).to(wdtype or dtype)
    dy = torch.randn(B, T, C, generator=g).to(dtype)
    return x, w, dy


def _check(x, w, dy, padding_l, dtype, **launch):
    """Forward and both gradients through autograd (or the private launchers when `launch` is set)."""
    if launch:
        y = lc_ops._launch_forward(x, w, padding_l, launch.get("blocks"))
        dx, dw = lc_ops._launch_backward(dy, x, w, padding_l, **launch)
    else:
        xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
        y = lightconv(xg, wg, padding_l)
        y.backward(dy)
        dx, dw = xg.grad, wg.grad
    assert y.dtype == x.dtype and dx.dtype == x.dtype and dw.dtype == w.dtype
    y_ref, dx_ref, dw_ref = lightconv_reference_grads(x, w, padding_l, dy)
    assert_close("y", y, y_ref, dtype)
    assert_close("dx", dx, dx_ref, dtype)
    assert_close("dw", dw, dw_ref, torch.promote_types(dtype, w.dtype) if w.dtype != dtype else dtype)


@pytest.mark.parametrize("T", [1, 5, 17, 64])
@pytest.mark.parametrize("K", [3, 7, 15, 31])
@pytest.mark.parametrize("causal", [False, True], ids=["enc", "dec"])
def test_fp32(T, K, causal):
    x, w, dy = _inputs(2, T, 24, 4, K, torch.float32, seed=T * 100 + K)
    _check(x, w, dy, K - 1 if causal else K // 2, torch.float32)


@pytest.mark.parametrize(
    "T,K,padding_l,C,H",
    [(64, 31, 15, 64, 4), (17, 15, 14, 36, 3), (5, 7, 3, 16, 16), (1, 3, 2, 8, 1), (17, 31, 0, 20, 5)],
)
def test_fp16(T, K, padding_l, C, H):
    x, w, dy = _inputs(2, T, C, H, K, torch.float16, seed=K)
    _check(x, w, dy, padding_l, torch.float16)


@pytest.mark.parametrize("T,K,padding_l", [(17, 7, 6), (64, 15, 7)])
def test_bf16(T, K, padding_l):
    """bf16 works in the interpreter because the kernels upcast at load."""
    x, w, dy = _inputs(2, T, 24, 4, K, torch.bfloat16, seed=K)
    _check(x, w, dy, padding_l, torch.bfloat16)


@pytest.mark.parametrize("K,padding_l", [(1, 0), (2, 1), (4, 3), (9, 0), (16, 8), (63, 31), (63, 62)])
def test_kernel_sizes(K, padding_l):
    """Odd/even K from 1 to 63 with every kind of padding, K much larger than T."""
    x, w, dy = _inputs(1, 5, 8, 2, K, torch.float32, seed=K)
    _check(x, w, dy, padding_l, torch.float32)

def test_mixed_dtypes_fp16_x_fp32_weight():
    x, w, dy = _inputs(2, 17, 24, 4, 7, torch.float16, wdtype=torch.float32)
    _check(x, w, dy, 3, torch.float16)


@pytest.mark.parametrize(
    "T,K,padding_l,blocks,steps",
    [(40, 31, 30, (16, 16), 1), (40, 31, 15, (16, 16), 2), (17, 15, 7, (8, 16), 2)],
)
def test_block_edges(T, K, padding_l, blocks, steps):
    """Small blocks: several time/channel blocks with partial last ones, K > BLOCK_T, heads
    straddling channel blocks (C/H = 6 vs BLOCK_C = 16), several weight-gradient chunks."""
    x, w, dy = _inputs(1, T, 24, 4, K, torch.float32, seed=7)
    _check(x, w, dy, padding_l, torch.float32, blocks=blocks, steps=steps)


@pytest.mark.parametrize("causal", [False, True], ids=["enc", "dec"])
def test_padded_batch(causal):
    """Rows with a zero tail: matches the reference and, on the valid prefix, the unpadded row."""
    K, T = 7, 17
    p = K - 1 if causal else K // 2
    x, w, dy = _inputs(2, T, 24, 4, K, torch.float32, seed=3)
    x = pad_tail(x, [T, 9])
    dy = pad_tail(dy, [T, 9])
    _check(x, w, dy, p, torch.float32)
    y = lightconv(x, w, p)
    y_short = lightconv(x[1:, :9].contiguous(), w, p)
    torch.testing.assert_close(y[1, :9], y_short[0], rtol=1e-6, atol=1e-6)


def test_non_contiguous_input():
    x, w, _ = _inputs(2, 17, 24, 4, 7, torch.float32)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)
    assert not xt.is_contiguous()
    assert_close("y", lightconv(xt, w, 3), lightconv_reference(x.double(), w.double(), 3), torch.float32)


def test_empty_batch():
    x = torch.zeros(0, 5, 8, requires_grad=True)
    w = torch.zeros(2, 3, requires_grad=True)
    y = lightconv(x, w, 1)
    assert y.shape == (0, 5, 8)
    y.sum().backward()
    assert x.grad.shape == x.shape and w.grad.shape == w.shape and not w.grad.any()

def test_outputs_nan_filled_under_interpreter():
    assert common.interpreting() and common.nan_fill_outputs()
    assert torch.isnan(common.new_output((3,), torch.float16, torch.device("cpu"))).all()


def test_autocast_runs_in_autocast_dtype():
    x, w, dy = _inputs(2, 17, 24, 4, 7, torch.float32)
    wp = w.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.float16):
        y = lightconv(x, wp, 3)
    assert y.dtype == torch.float16
    y.backward(dy.half())
    assert wp.grad.dtype == torch.float32
    ref = lightconv_reference(x.half().double(), w.half().double(), 3)
    assert_close("y", y, ref, torch.float16)


def test_torch_compile_traces_through_op():
    x, w, dy = _inputs(2, 17, 24, 4, 7, torch.float32)

    def f(x, w):
        return lightconv(x * 2, w, 6).sum(-1)

    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(xg, wg)
    out.backward(dy.sum(-1))
    xr, wr = x.double().requires_grad_(True), w.double().requires_grad_(True)
    ref = lightconv_reference(xr * 2, wr, 6).sum(-1)
    ref.backward(dy.sum(-1).double())
    assert_close("y", out, ref, torch.float32)
    assert_close("dx", xg.grad, xr.grad, torch.float32)
    assert_close("dw", wg.grad, wr.grad, torch.float32)


@pytest.mark.parametrize(
    "make,exc,match",
    [
        (lambda: (torch.zeros(2, 5), torch.zeros(4, 3), 1), ValueError, "x must have 3 dims"),
        (lambda: (torch.zeros(2, 5, 8), torch.zeros(4, 3, 1), 1), ValueError, "weight must have 2 dims"),
        (lambda: (torch.zeros(2, 5, 10), torch.zeros(4, 3), 1), ValueError, "divisible"),
        (lambda: (torch.zeros(2, 5, 8), torch.zeros(4, 3), 3), ValueError, "padding_l=3 out of range"),
        (lambda: (torch.zeros(2, 5, 8), torch.zeros(4, 3), -1), ValueError, "out of range"),
        (lambda: (torch.zeros(2, 5, 8), torch.zeros(4, 3), True), TypeError, "padding_l must be an int"),
        (lambda: (torch.zeros(2, 5, 8), torch.zeros(4, common.MAX_K + 1), 0), ValueError, "kernel size"),
        (lambda: (torch.zeros(2, 5, 8, dtype=torch.float64), torch.zeros(4, 3), 1), TypeError, "dtype"),
        (lambda: (torch.zeros(2, 5, 8), torch.zeros(4, 3, dtype=torch.int32), 1), TypeError, "dtype"),
        (lambda: ([[0.0]], torch.zeros(4, 3), 1), TypeError, "torch.Tensor"),
        (lambda: (torch.zeros(2, 5, 8, device="meta"), torch.zeros(4, 3, device="meta"), 1), ValueError,
         "CUDA"),
    ],
)
def test_clear_errors(make, exc, match):
    x, w, p = make()
    with pytest.raises(exc, match=match):
        lightconv(x, w, p)


def test_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.setattr(common, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="CUDA"):
        lightconv(torch.zeros(1, 4, 8), torch.zeros(2, 3), 1)
