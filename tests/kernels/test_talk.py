"""TaLK Triton kernels under the interpreter vs. the float64 integral-form reference (y, dx, dleft, dright)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.checks import assert_close, pad_tail
from triton_kernels import common
from triton_kernels.talk import ops as talk_ops
from triton_kernels.talk import talk
from triton_kernels.talk.reference import talk_reference, talk_reference_grads

pytestmark = pytest.mark.interpret


def _offsets(B, T, H, k, scale, g):
    """σ in (0, scale) with σ·k at least 0.01 from an integer: no boundary lands on (or, in fp32, rounds to)
    an integer, where the offset gradient switches between two defensible values."""
    sigma = torch.empty(B, T, H)
    todo = torch.ones_like(sigma, dtype=torch.bool)
    while todo.any():
        sigma[todo] = (0.01 + 0.98 * torch.rand(int(todo.sum()), generator=g)) * scale
        frac = torch.frac(sigma * max(k, 1))
        todo = (frac < 0.01) | (frac > 0.99)
    return sigma


def _inputs(B, T, C, H, dtype, causal, k=7, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g).to(dtype)
    left = _offsets(B, T, H, k, scale, g)
    right = None if causal else _offsets(B, T, H, k, scale, g)
    dy = torch.randn(B, T, C, generator=g).to(dtype)
    return x, left, right, dy


def _check(x, left, right, dy, l_max, r_max, dtype, max_offset=1.0, blocks=None):
    if blocks:
        y = talk_ops._launch_forward(x, left, right, l_max, r_max, max_offset, blocks)
        dx, dleft, dright = talk_ops._launch_backward(dy, x, left, right, l_max, r_max, max_offset, blocks)
        dright = None if right is None else dright
    else:
        xg, lg = x.clone().requires_grad_(True), left.clone().requires_grad_(True)
        rg = None if right is None else right.clone().requires_grad_(True)
        y = talk(xg, lg, rg, l_max, r_max, max_offset)
        y.backward(dy)
        dx, dleft, dright = xg.grad, lg.grad, None if rg is None else rg.grad
    assert y.dtype == x.dtype and dx.dtype == x.dtype and dleft.dtype == left.dtype
    y_ref, dx_ref, dl_ref, dr_ref = talk_reference_grads(x, left, right, l_max, r_max, dy)
    assert_close("y", y, y_ref, dtype)
    assert_close("dx", dx, dx_ref, dtype)
    # offsets are fp32, but their gradient sums dy·x products of the input dtype
    assert_close("dleft", dleft, dl_ref, dtype)
    if right is not None:
        assert_close("dright", dright, dr_ref, dtype)


@pytest.mark.parametrize("T", [1, 5, 17, 64])
@pytest.mark.parametrize("k", [1, 3, 7, 15, 31])
@pytest.mark.parametrize("causal", [False, True], ids=["enc", "dec"])
def test_fp32(T, k, causal):
    x, left, right, dy = _inputs(2, T, 24, 2, torch.float32, causal, k, seed=T * 100 + k)  # C/H = 12
    _check(x, left, right, dy, k, 0 if causal else k, torch.float32)


@pytest.mark.parametrize("T,k,C,H,causal", [(64, 31, 64, 2, False), (17, 15, 36, 3, True), (5, 7, 16, 16, False),
                                            (1, 3, 8, 1, True), (17, 31, 40, 1, False), (64, 1, 32, 4, True)])
def test_fp16(T, k, C, H, causal):
    x, left, right, dy = _inputs(2, T, C, H, torch.float16, causal, k, seed=k)
    _check(x, left, right, dy, k, 0 if causal else k, torch.float16)


@pytest.mark.parametrize("causal", [False, True], ids=["enc", "dec"])
def test_bf16(causal):
    x, left, right, dy = _inputs(2, 17, 24, 4, torch.bfloat16, causal, seed=5)
    _check(x, left, right, dy, 7, 0 if causal else 7, torch.bfloat16)


def test_different_left_and_right_extents():
    """The Deep CNN-DM preset uses separate left and right offset lists."""
    x, left, right, dy = _inputs(2, 17, 24, 4, torch.float32, False, k=21, seed=11)
    _check(x, left, right, dy, 7, 3, torch.float32)


@pytest.mark.parametrize("causal", [False, True], ids=["enc", "dec"])
def test_offsets_above_one_under_dropout(causal):
    """Offset dropout scales kept offsets by 1/(1−p): windows reach past l_max, up to ⌈l_max·max_offset⌉."""
    x, left, right, dy = _inputs(2, 33, 16, 2, torch.float32, causal, 7, seed=2, scale=1 / 0.7)
    _check(x, left, right, dy, 7, 0 if causal else 7, torch.float32, max_offset=1 / 0.7)


def test_offsets_beyond_max_offset_are_clamped():
    x, left, right, _ = _inputs(1, 9, 8, 2, torch.float32, False, seed=4, scale=3.0)
    y = talk(x, left, right, 3, 3, 1.5)
    ref = talk_reference(x.double(), left.double().clamp(max=1.5), right.double().clamp(max=1.5), 3, 3)
    assert_close("y", y, ref, torch.float32)


@pytest.mark.parametrize("T,k,C,H,blocks", [(40, 31, 40, 1, (16, 16)), (40, 7, 24, 4, (8, 16)),
                                             (17, 15, 96, 2, (8, 16))])
@pytest.mark.parametrize("causal", [False, True], ids=["enc", "dec"])
def test_block_edges(T, k, C, H, blocks, causal):
    """Small blocks: several partial time blocks, windows longer than a block, several channel blocks per
    head (C/H = 40 -> 16+16+8, 48 -> 3x16), heads narrower than a block (C/H = 6), a multi-block prefix scan."""
    x, left, right, dy = _inputs(1, T, C, H, torch.float32, causal, k, seed=7)
    _check(x, left, right, dy, k, 0 if causal else k, torch.float32, blocks=blocks)


@pytest.mark.parametrize("causal", [False, True], ids=["enc", "dec"])
def test_padded_batch(causal):
    """A row with a zero tail (the mixer zeroes pads): matches the reference, and on the valid prefix the
    decoder equals the unpadded row (the encoder's windows are clamped to the padded length by design)."""
    k, T = 7, 17
    x, left, right, dy = _inputs(2, T, 24, 4, torch.float32, causal, seed=3)
    x, dy = pad_tail(x, [T, 9]), pad_tail(dy, [T, 9])
    _check(x, left, right, dy, k, 0 if causal else k, torch.float32)
    if causal:
        y = talk(x, left, None, k, 0)
        y_short = talk(x[1:, :9].contiguous(), left[1:, :9].contiguous(), None, k, 0)
        torch.testing.assert_close(y[1, :9], y_short[0], rtol=1e-6, atol=1e-6)


def test_non_contiguous_inputs():
    x, left, right, _ = _inputs(2, 17, 24, 4, torch.float32, False)
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)
    lt = left.transpose(0, 1).contiguous().transpose(0, 1)
    assert not xt.is_contiguous() and not lt.is_contiguous()
    ref = talk_reference(x.double(), left.double(), right.double(), 3, 3)
    assert_close("y", talk(xt, lt, right, 3, 3), ref, torch.float32)


def test_empty_batch():
    x = torch.zeros(0, 5, 8, requires_grad=True)
    left = torch.zeros(0, 5, 2, requires_grad=True)
    y = talk(x, left, None, 3, 0)
    assert y.shape == (0, 5, 8)
    y.sum().backward()
    assert x.grad.shape == x.shape and left.grad.shape == left.shape and not left.grad.any()


def test_autocast_casts_x_and_keeps_fp32_offsets():
    x, left, right, dy = _inputs(2, 17, 24, 4, torch.float32, False)
    lg = left.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.float16):
        y = talk(x, lg, right, 7, 7)
    assert y.dtype == torch.float16
    y.backward(dy.half())
    assert lg.grad.dtype == torch.float32
    assert_close("y", y, talk_reference(x.half().double(), left.double(), right.double(), 7, 7), torch.float16)


def test_torch_compile_traces_through_op():
    """Offsets from a Linear + sigmoid in PyTorch, then the op; compiled with aot_eager on CPU."""
    B, T, C, H, k = 2, 17, 24, 4, 7
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, T, C, generator=g)
    lin = torch.randn(2 * H, C, generator=g) * 0.5
    dy = torch.randn(B, T, C, generator=g)

    def f(x, lin, fn):
        sigma = torch.sigmoid(x @ lin.t())
        return fn(x, sigma[..., :H], sigma[..., H:], k, k)

    xg, lg = x.clone().requires_grad_(True), lin.clone().requires_grad_(True)
    out = torch.compile(lambda a, b: f(a, b, talk), backend="aot_eager", fullgraph=True)(xg, lg)
    out.backward(dy)
    xr, lr = x.double().requires_grad_(True), lin.double().requires_grad_(True)
    ref = f(xr, lr, talk_reference)
    ref.backward(dy.double())
    assert_close("y", out, ref, torch.float32)
    assert_close("dx", xg.grad, xr.grad, torch.float32)
    assert_close("dlin", lg.grad, lr.grad, torch.float32)


@pytest.mark.parametrize(
    "args,exc,match",
    [
        (((2, 5), (2, 5, 2), None, 3, 0), ValueError, "x must have 3 dims"),
        (((2, 5, 8), (2, 4, 2), None, 3, 0), ValueError, r"\(B, T, H\)"),
        (((2, 5, 8), (2, 5, 3), None, 3, 0), ValueError, "divisible"),
        (((2, 5, 8), (2, 5, 2), (2, 5, 4), 3, 3), ValueError, "shape of left"),
        (((2, 5, 8), (2, 5, 2), None, 3, 3), ValueError, "r_max must be 0"),
        (((2, 5, 8), (2, 5, 2), None, -1, 0), ValueError, "l_max must be an int"),
        (((2, 5, 8), (2, 5, 2), None, 3.0, 0), ValueError, "l_max must be an int"),
    ],
)
def test_clear_errors(args, exc, match):
    xs, ls, rs, l_max, r_max = args
    with pytest.raises(exc, match=match):
        talk(torch.zeros(xs), torch.zeros(ls), None if rs is None else torch.zeros(rs), l_max, r_max)


def test_bad_dtype_device_and_max_offset():
    with pytest.raises(TypeError, match="dtype"):
        talk(torch.zeros(1, 4, 8, dtype=torch.float64), torch.zeros(1, 4, 2), None, 3, 0)
    with pytest.raises(ValueError, match="max_offset"):
        talk(torch.zeros(1, 4, 8), torch.zeros(1, 4, 2), None, 3, 0, 0.0)
    with pytest.raises(ValueError, match="CUDA"):
        talk(torch.zeros(1, 4, 8, device="meta"), torch.zeros(1, 4, 2, device="meta"), None, 3, 0)


def test_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.setattr(common, "interpreting", lambda: False)
    with pytest.raises(ValueError, match="CUDA"):
        talk(torch.zeros(1, 4, 8), torch.zeros(1, 4, 2), None, 3, 0)
