"""Label-smoothed loss against an explicit smoothed target distribution; lr schedules against formulas."""

from __future__ import annotations

import math

import pytest
import torch

from seqmix.tasks.losses import label_smoothed_nll_loss
from seqmix.tasks.schedulers import cosine, inverse_sqrt

PAD = 1


def test_label_smoothed_loss_matches_explicit_distribution():
    torch.manual_seed(0)
    v, eps = 7, 0.1
    logits = torch.randn(2, 5, v, dtype=torch.float64)
    target = torch.randint(2, v, (2, 5))
    target[1, 3:] = PAD
    loss, nll, n = label_smoothed_nll_loss(logits, target, eps, PAD)
    lp = torch.log_softmax(logits, -1)
    exp_loss = exp_nll = 0.0
    eps_i = eps / (v - 1)
    for b in range(2):
        for t in range(5):
            y = int(target[b, t])
            if y == PAD:
                continue
            # fairseq's weights: (1 - eps) on the target, eps/(V-1) on every other class
            q = torch.full((v,), eps_i, dtype=torch.float64)
            q[y] = 1 - eps
            exp_loss += float(-(q * lp[b, t]).sum())
            exp_nll += float(-lp[b, t, y])
    assert n == 8
    assert loss.item() == pytest.approx(exp_loss, rel=1e-6)
    assert nll.item() == pytest.approx(exp_nll, rel=1e-6)


def test_zero_smoothing_is_cross_entropy():
    logits = torch.randn(3, 4, 9)
    target = torch.randint(2, 9, (3, 4))
    loss, nll, n = label_smoothed_nll_loss(logits, target, 0.0, PAD)
    ce = torch.nn.functional.cross_entropy(logits.view(-1, 9), target.view(-1), reduction="sum")
    assert loss.item() == pytest.approx(ce.item(), rel=1e-5) and nll.item() == pytest.approx(ce.item(), rel=1e-5)


def _lrs(sched, steps):
    out = []
    for _ in range(steps):
        out.append(sched.optimizer.param_groups[0]["lr"])
        sched.optimizer.step()
        sched.step()
    return out


def test_inverse_sqrt_schedule():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    lrs = _lrs(inverse_sqrt(opt, warmup_updates=10, warmup_init_lr=1e-7), 41)
    assert lrs[0] == pytest.approx(1e-7)
    assert lrs[5] == pytest.approx(1e-7 + (1e-3 - 1e-7) * 0.5)
    assert lrs[10] == pytest.approx(1e-3)
    assert lrs[40] == pytest.approx(1e-3 * math.sqrt(10 / 40))


def test_cosine_schedule():
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    lrs = _lrs(cosine(opt, total_updates=30, warmup_updates=10, min_lr=1e-5), 31)
    assert lrs[10] == pytest.approx(1e-3)
    assert lrs[20] == pytest.approx(1e-5 + (1e-3 - 1e-5) * 0.5)
    assert lrs[30] == pytest.approx(1e-5)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
