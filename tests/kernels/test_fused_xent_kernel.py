"""Fused output projection + label-smoothed cross-entropy kernels under the interpreter vs. the float64
reference (forward sums and both gradients). The AOT compile (sm_80 / sm_90, no spills) is in
test_aot_compile.py with the other kernels."""

from __future__ import annotations

import pytest
import torch

from seqmix.kernel_backend import FUSED_LABEL_SMOOTHED_LOSS, triton_function
from tests.kernels.checks import assert_close
from triton_kernels.fused_xent import fused_label_smoothed_loss
from triton_kernels.fused_xent import ops as xent_ops
from triton_kernels.fused_xent.reference import fused_loss_reference_grads

PAD = 1
SMALL_BLOCKS = (16, 16, 16, 16)  # several row / vocabulary / reduction / channel blocks at tiny shapes


def _inputs(N, V, C, dtype, n_pad=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(N, C, generator=g).to(dtype)
    weight = (torch.randn(V, C, generator=g) / C ** 0.25).to(dtype)
    target = torch.randint(0, V, (N,), generator=g)
    target[target == PAD] = 0
    target[torch.randperm(N, generator=g)[:n_pad]] = PAD
    return features, weight, target


def _run(features, weight, target, eps, g_loss=1.0, g_nll=0.0):
    leaves = [t.clone().requires_grad_(True) for t in (features, weight)]
    loss, nll = fused_label_smoothed_loss(*leaves, target, eps, PAD)
    (g_loss * loss + g_nll * nll).backward()
    return loss, nll, leaves[0].grad, leaves[1].grad


def _check(got, want, dtype):
    for name, a, b in zip(("loss", "nll", "d features", "d weight"), got, want):
        assert_close(name, a, b, dtype)


@pytest.mark.interpret
@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("N,V,C", [(37, 45, 5), (20, 33, 19), (5, 2, 3)])
def test_fp32_matches_reference(N, V, C, eps):
    """N and V not multiples of the blocks, tiny C; the op's default (64-wide) blocks."""
    features, weight, target = _inputs(N, V, C, torch.float32, seed=N)
    got = _run(features, weight, target, eps, 2.0, 0.5)
    _check(got, fused_loss_reference_grads(features, weight, target, eps, PAD, 2.0, 0.5), torch.float32)
    assert got[0].shape == () and got[0].dtype == torch.float32 and got[1].dtype == torch.float32


@pytest.mark.interpret
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_small_blocks_cross_tile_edges(eps):
    """16-wide blocks: 3 row blocks (37), 3 vocabulary tiles (45 = 16+16+13), 2 reduction steps and
    2 channel blocks of the gradients (C = 20), the online max rescaled across tiles."""
    features, weight, target = _inputs(37, 45, 20, torch.float32, seed=3)
    features[0] *= 30  # a row whose max moves between vocabulary tiles
    lse_args = (features, weight, target, eps, PAD)
    loss_rows, nll_rows, lse = xent_ops._launch_forward(*lse_args, blocks=SMALL_BLOCKS)
    g_loss, g_nll = torch.full((37,), 1.5), torch.full((37,), -0.5)
    df, dw = xent_ops._launch_backward(g_loss, g_nll, features, weight, target, lse, eps, PAD, blocks=SMALL_BLOCKS)
    want = fused_loss_reference_grads(features, weight, target, eps, PAD, 1.5, -0.5)
    _check((loss_rows.sum(), nll_rows.sum(), df, dw), want, torch.float32)
    assert (loss_rows[target == PAD] == 0).all() and (nll_rows[target == PAD] == 0).all()


@pytest.mark.interpret
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(dtype):
    """fp32 accumulation; gradients come back in the input dtype."""
    features, weight, target = _inputs(21, 40, 24, dtype, seed=7)
    got = _run(features, weight, target, 0.1)
    assert got[2].dtype == dtype and got[3].dtype == dtype and got[0].dtype == torch.float32
    _check(got, fused_loss_reference_grads(features, weight, target, 0.1, PAD), dtype)


@pytest.mark.interpret
def test_all_pads_give_zero_loss_and_gradients():
    features, weight, target = _inputs(6, 9, 4, torch.float32)
    target[:] = PAD
    loss, nll, df, dw = _run(features, weight, target, 0.1)
    assert loss.item() == 0.0 and nll.item() == 0.0
    assert not df.any() and not dw.any()


@pytest.mark.interpret
def test_gradient_of_nll_alone():
    """Only nll in the graph: the unused loss output's gradient arrives as None."""
    features, weight, target = _inputs(9, 11, 6, torch.float32, seed=2)
    f = features.clone().requires_grad_(True)
    _, nll = fused_label_smoothed_loss(f, weight, target, 0.1, PAD)
    nll.backward()
    _, _, df, _ = fused_loss_reference_grads(features, weight, target, 0.1, PAD, 0.0, 1.0)
    assert_close("d features", f.grad, df, torch.float32)


@pytest.mark.interpret
def test_torch_compile_traces_through_op():
    features, weight, target = _inputs(9, 11, 6, torch.float32, seed=5)
    fn = torch.compile(fused_label_smoothed_loss, backend="aot_eager", fullgraph=True)
    loss, nll = fn(features, weight, target, 0.1, PAD)
    want = fused_loss_reference_grads(features, weight, target, 0.1, PAD)
    assert_close("loss", loss, want[0], torch.float32)
    assert_close("nll", nll, want[1], torch.float32)


def test_backend_dispatch_resolves_to_this_op():
    x = torch.zeros(2, 3)
    assert triton_function("triton", x, FUSED_LABEL_SMOOTHED_LOSS) is fused_label_smoothed_loss
    assert triton_function("auto", x, FUSED_LABEL_SMOOTHED_LOSS) is None  # CPU: PyTorch path


@pytest.mark.parametrize(
    "shapes,eps,exc,match",
    [
        (((4, 3), (5, 2), (4,)), 0.1, ValueError, r"weight must be \(V, C=3\)"),
        (((4, 3), (5, 3), (3,)), 0.1, ValueError, "target has 3 entries"),
        (((4, 3), (1, 3), (4,)), 0.1, ValueError, "at least 2"),
        (((4, 3), (5, 3), (4,)), 1.0, ValueError, "epsilon"),
        (((4,), (5, 3), (4,)), 0.1, ValueError, "features must have 2 dims"),
    ],
)
def test_clear_errors(shapes, eps, exc, match):
    f, w, t = shapes
    with pytest.raises(exc, match=match):
        fused_label_smoothed_loss(torch.zeros(f), torch.zeros(w), torch.zeros(t, dtype=torch.long), eps, PAD)


def test_bad_dtypes():
    with pytest.raises(TypeError, match="cast them alike"):
        fused_label_smoothed_loss(torch.zeros(4, 3), torch.zeros(5, 3, dtype=torch.float16),
                                  torch.zeros(4, dtype=torch.long), 0.1, PAD)
    with pytest.raises(TypeError, match="target"):
        fused_label_smoothed_loss(torch.zeros(4, 3), torch.zeros(5, 3), torch.zeros(4), 0.1, PAD)
