"""The training contexts match their definitions over many draws (DisCo per-query sets, CMLM masked positions)."""

from __future__ import annotations

import torch

from seqmix.models.nat_masks import cmlm_masked, disco_observed

PAD, EOS = 1, 2
DRAWS = 4000


def batch(rows: int) -> torch.Tensor:
    """Rows of 5 real tokens + eos + 2 pads (N = 6 counting eos), and rows of 2 real tokens + eos + 5 pads."""
    long = torch.tensor([5, 6, 7, 8, 9, EOS, PAD, PAD])
    short = torch.tensor([5, 6, EOS, PAD, PAD, PAD, PAD, PAD])
    return torch.stack([long if i % 2 == 0 else short for i in range(rows)])


def test_disco_observed_sets_follow_the_definition():
    gen = torch.Generator().manual_seed(0)
    target = batch(DRAWS)
    obs = disco_observed(target, PAD, EOS, gen)
    long, short = obs[0::2], obs[1::2]
    # eos always visible, pads never, never itself
    assert long[:, :, 5].all() and short[:, :, 2].all()
    assert not long[:, :, 6:].any() and not short[:, :, 3:].any()
    assert not torch.diagonal(long, dim1=1, dim2=2)[:, :5].any() and not torch.diagonal(short, dim1=1, dim2=2)[:, :2].any()
    # per real query: the number of other real tokens seen is uniform over {0 .. N-2}
    for rows, n_real in ((long, 5), (short, 2)):
        k = rows[:, :n_real, :n_real].sum(dim=-1).flatten()  # eos column excluded
        freq = torch.bincount(k, minlength=n_real) / k.numel()
        assert freq.numel() == n_real  # never more than N-2 = n_real - 1 others
        assert torch.allclose(freq, torch.full_like(freq, 1 / n_real), atol=0.02), freq
    # the chosen tokens are uniform among the others: for query 0 of a long row, each other real token is seen
    # with probability E[k]/4 = 0.5, and given k = 2 each of the 6 pairs equally often
    seen = long[:, 0, 1:5].float()
    assert torch.allclose(seen.mean(0), torch.full((4,), 0.5), atol=0.03), seen.mean(0)
    pairs = seen[seen.sum(1) == 2]
    codes = (pairs * torch.tensor([1.0, 2.0, 4.0, 8.0])).sum(1).long()
    counts = torch.bincount(codes, minlength=16)[[3, 5, 6, 9, 10, 12]].float()
    assert (counts / counts.sum() - 1 / 6).abs().max() < 0.04, counts
    # independent across queries: the counts of two queries of the same row are uncorrelated
    k0, k1 = long[:, 0, :5].sum(-1).float(), long[:, 1, :5].sum(-1).float()
    corr = torch.corrcoef(torch.stack([k0, k1]))[0, 1]
    assert corr.abs() < 0.06, corr


def test_disco_observed_is_random_per_draw():
    target = batch(4)
    a = disco_observed(target, PAD, EOS, torch.Generator().manual_seed(1))
    b = disco_observed(target, PAD, EOS, torch.Generator().manual_seed(2))
    assert not torch.equal(a, b)


def test_cmlm_masks_follow_the_definition():
    gen = torch.Generator().manual_seed(0)
    target = batch(DRAWS)
    masked = cmlm_masked(target, PAD, EOS, gen)
    assert not masked[target.eq(PAD) | target.eq(EOS)].any()
    for rows, n_real in ((masked[0::2], 5), (masked[1::2], 2)):
        m = rows.sum(-1)
        assert m.min() >= 1 and m.max() <= n_real
        freq = torch.bincount(m, minlength=n_real + 1)[1:] / m.numel()
        assert torch.allclose(freq, torch.full_like(freq, 1 / n_real, dtype=torch.float), atol=0.03), freq
    # every real position equally likely: E[m]/n = 3/5 for the long rows
    inclusion = masked[0::2, :5].float().mean(0)
    assert torch.allclose(inclusion, torch.full((5,), 0.6), atol=0.03), inclusion
