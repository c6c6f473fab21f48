"""seqmix.layers.dropout: the CPU mask from 16-bit lanes drops at rate p (rounded to 2⁻¹⁶), independently per
element, scales kept elements so the mean is unchanged, follows the global seed, and backpropagates through the mask."""

from __future__ import annotations

import math

import pytest
import torch

from seqmix.layers.dropout import Dropout, dropout

N = 1 << 20


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
def test_drop_rate_and_scale(p):
    torch.manual_seed(0)
    x = torch.rand(N) + 0.5  # no zeros of its own
    y = dropout(x, p)
    dropped = (y == 0).double().mean().item()
    rounded = round(p * 65536) / 65536
    assert abs(dropped - rounded) < 6 * math.sqrt(p * (1 - p) / N)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / (1 - rounded))


def test_neighbouring_elements_are_independent():
    """Each 64-bit draw feeds four elements: pairs inside one draw and across draws are dropped together at rate p²."""
    torch.manual_seed(1)
    drop = dropout(torch.ones(N), 0.5) == 0
    for lag in (1, 2, 3, 4, 5):
        both = (drop[:-lag] & drop[lag:]).double().mean().item()
        assert abs(both - 0.25) < 6 * math.sqrt(0.25 * 0.75 / N), lag


def test_uniform_over_positions_in_a_draw():
    torch.manual_seed(2)
    drop = (dropout(torch.ones(N), 0.2) == 0).view(-1, 4).double().mean(0)
    assert torch.all((drop - 0.2).abs() < 6 * math.sqrt(0.2 * 0.8 / (N / 4)))


def test_seeded_and_fresh_per_call():
    x = torch.ones(1000, 37)
    torch.manual_seed(3)
    a, b = dropout(x, 0.1), dropout(x, 0.1)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.1), a) and not torch.equal(a, b)


def test_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(4)
    x = torch.randn(301, 7, dtype=torch.float64, requires_grad=True)
    y = dropout(x, 0.25)
    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    torch.testing.assert_close(g, (y.detach() != 0).double() / (1 - round(0.25 * 65536) / 65536))


def test_identity_outside_training_and_edge_rates():
    x = torch.randn(5, 3)
    assert dropout(x, 0.3, training=False) is x and dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))
    assert torch.equal(dropout(torch.ones(4), 1e-6), torch.ones(4))  # rounds to no drop, scale 1


def test_module_matches_nn_dropout_interface():
    m = Dropout(0.2)
    assert m.p == 0.2 and m.state_dict() == {} and "p=0.2" in repr(m)
    x = torch.rand(1000, 100) + 0.5
    assert torch.equal(m.eval()(x), x)
    y = m.train()(x)
    assert 0.18 < (y == 0).double().mean().item() < 0.22
