"""The per-head convolution core (seqmix.layers.banded) against loops over taps in float64: forward, input and tap
gradients, shared (LightConv) and per-position (DynamicConv) taps, every padding, odd lengths, kernels longer than the
chunk and than the sequence; fp32 (oneDNN/cuDNN depthwise path) against the same float64 loops."""

from __future__ import annotations

import pytest
import torch

from seqmix.layers import banded
from seqmix.layers.banded import band_matrices, banded_conv


def loop_reference(x: torch.Tensor, w: torch.Tensor, padding_l: int) -> torch.Tensor:
    """y[b,t,c] = Σ_k w[(b,t,)h(c),k] · x[b, t+k−padding_l, c], zeros outside the sequence (Wu et al. 2019, Eq. 2)."""
    bsz, length, channels = x.shape
    heads, k = w.shape[-2:]
    y = torch.zeros_like(x, dtype=torch.float64)
    for t in range(length):
        for j in range(k):
            s = t + j - padding_l
            if 0 <= s < length:
                taps = w[:, j] if w.dim() == 2 else w[:, t, :, j]
                y[:, t] += taps.double().repeat_interleave(channels // heads, dim=-1) * x[:, s].double()
    return y


def grads(fn, x, w, gy, padding_l):
    x, w = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
    y = fn(x, w, padding_l)
    return (y, *torch.autograd.grad(y, (x, w), gy))


SHAPES = [  # (B, T, C, H, K): K > chunk (40, 65), K > T, T = 1, T not a multiple of the chunk
    (2, 9, 4, 2, 5), (3, 70, 8, 2, 31), (2, 5, 6, 3, 40), (1, 1, 4, 2, 3), (2, 33, 4, 1, 65), (2, 64, 8, 4, 7)]


@pytest.mark.parametrize("per_position", [False, True], ids=["shared", "per_position"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_float64_matches_loops(shape, per_position):
    b, t, c, h, k = shape
    g = torch.Generator().manual_seed(sum(shape))
    x, gy = torch.randn(b, t, c, generator=g, dtype=torch.float64), torch.randn(b, t, c, generator=g, dtype=torch.float64)
    w = torch.randn(*((b, t) if per_position else ()), h, k, generator=g, dtype=torch.float64)
    for padding_l in sorted({0, k // 2, k - 1}):
        got = grads(banded_conv, x, w, gy, padding_l)
        want = grads(loop_reference, x, w, gy, padding_l)
        for name, a, e in zip(("y", "dx", "dw"), got, want):
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10, msg=f"{name} padding_l={padding_l}")


@pytest.mark.parametrize("per_position", [False, True], ids=["shared", "per_position"])
def test_fp32_matches_float64(per_position):
    """fp32 runs the depthwise-conv and GEMM paths used in training; padding_l both causal and centred."""
    b, t, c, h, k = 3, 77, 32, 4, 15
    g = torch.Generator().manual_seed(1)
    x, gy = torch.randn(b, t, c, generator=g), torch.randn(b, t, c, generator=g)
    w = torch.softmax(torch.randn(*((b, t) if per_position else ()), h, k, generator=g), dim=-1)
    for padding_l in (k - 1, k // 2, 3):
        got = grads(banded_conv, x, w, gy, padding_l)
        want = grads(loop_reference, x.double(), w.double(), gy.double(), padding_l)
        for name, a, e in zip(("y", "dx", "dw"), got, want):
            assert a.dtype == torch.float32
            torch.testing.assert_close(a.double(), e, rtol=1e-4, atol=1e-4, msg=f"{name} padding_l={padding_l}")


def test_low_precision_input_is_computed_in_fp32_and_returned_in_its_dtype():
    x = torch.randn(2, 19, 8).to(torch.bfloat16)
    w = torch.softmax(torch.randn(2, 5), dim=-1)
    y = banded_conv(x, w, 4)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), loop_reference(x.float(), w, 4), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("per_position", [False, True], ids=["shared", "per_position"])
def test_autocast_bf16_still_computes_in_fp32(per_position):
    """trainer.precision=bf16-mixed: autocast must not turn the core's conv2d/bmm into bf16 (nor break backward)."""
    g = torch.Generator().manual_seed(5)
    x, gy = torch.randn(2, 40, 16, generator=g), torch.randn(2, 40, 16, generator=g)
    w = torch.softmax(torch.randn(*((2, 40) if per_position else ()), 4, 9, generator=g), dim=-1)
    want = grads(banded_conv, x, w, gy, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = grads(banded_conv, x, w, gy, 8)
    for a, e in zip(got, want):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)


def test_chunk_size_does_not_change_the_result(monkeypatch):
    """Windows that reach one, two or more chunks ahead (K−1 vs L) give the same numbers."""
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(2, 50, 8, generator=g, dtype=torch.float64), torch.randn(2, 50, 2, 9, generator=g, dtype=torch.float64)
    gy = torch.randn(2, 50, 8, generator=g, dtype=torch.float64)
    want = grads(loop_reference, x, w, gy, 4)
    for chunk in (1, 3, 8, 64):
        monkeypatch.setattr(banded, "CHUNK", chunk)
        for a, e in zip(grads(banded_conv, x, w, gy, 4), want):
            torch.testing.assert_close(a, e, rtol=1e-10, atol=1e-10)


def test_band_matrices_put_tap_k_of_row_i_at_column_i_plus_k():
    w = torch.arange(1.0, 13.0).view(3, 4)  # L=3 rows, K=4 taps
    band = band_matrices(w, 7)
    for i in range(3):
        for col in range(7):
            assert band[i, col] == (w[i, col - i] if 0 <= col - i < 4 else 0)


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="not divisible"):
        banded_conv(torch.randn(1, 4, 6), torch.randn(4, 3), 1)
    with pytest.raises(ValueError, match="padding_l"):
        banded_conv(torch.randn(1, 4, 8), torch.randn(4, 3), 3)
