from collections import Counter

import numpy as np
import pytest

from seqmix.data.batching import TokenBudgetBatchSampler
from seqmix.data.dataset import filter_by_length
from seqmix.errors import SeqmixError

MAX_TOKENS, MAX_SENTENCES = 1000, 64


@pytest.fixture(scope="module")
def lengths(multi30k_dir):
    """Multi30k train lengths as batched: whitespace words + eos (a stand-in for subword counts)."""
    path = multi30k_dir
    from seqmix.data.sources import LocalParallelSource

    train = LocalParallelSource(str(path), "en", "de").read("train")
    src = np.array([len(s.split()) + 1 for s in train.src])
    tgt = np.array([len(t.split()) + 1 for t in train.tgt])
    keep, _ = filter_by_length(src, tgt, 30, 30)
    return src[keep], tgt[keep]


def make(lengths, **kw):
    args = {"max_tokens": MAX_TOKENS, "max_sentences": MAX_SENTENCES, "seed": 3, **kw}
    return TokenBudgetBatchSampler(lengths[0], lengths[1], **args)


def epoch(sampler, e):
    sampler.set_epoch(e)
    return list(sampler)


def test_batches_fit_budget_and_cover_each_index_once(lengths):
    src, tgt = lengths
    sampler = make(lengths)
    batches = epoch(sampler, 0)
    assert len(sampler) == len(batches)
    for b in batches:
        assert 0 < len(b) <= MAX_SENTENCES
        assert len(b) * max(src[b].max(), tgt[b].max()) <= MAX_TOKENS
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(src)))
    # Length bucketing actually pads little: real tokens fill most of each padded batch.
    padded = sum(len(b) * max(src[b].max(), tgt[b].max()) for b in batches)
    assert np.maximum(src, tgt).sum() / padded > 0.9


def test_epochs_reshuffle_reproducibly(lengths):
    a, b = make(lengths), make(lengths)
    e0, e1 = epoch(a, 0), epoch(a, 1)
    assert e0 != e1 and sorted(map(sorted, e0)) != sorted(map(sorted, e1))  # order and tie-breaks change
    assert epoch(b, 1) == e1 and epoch(b, 0) == e0 and epoch(a, 0) == e0
    assert len(e0) == len(e1)  # the batch count does not depend on the shuffle
    assert epoch(make(lengths, seed=4), 0) != e0


def test_no_shuffle_is_sorted_and_deterministic(lengths):
    src, tgt = lengths
    batches = list(make(lengths, shuffle=False))
    assert batches == list(make(lengths, shuffle=False)) == epoch(make(lengths, shuffle=False), 5)
    flat = np.array([i for b in batches for i in b])
    key = np.maximum(src, tgt)[flat]
    assert (np.diff(key) >= 0).all()


@pytest.mark.parametrize("world_size", [2, 3])
def test_training_ranks_are_disjoint_equal_and_complete(lengths, world_size):
    full = epoch(make(lengths), 2)
    ranks = [epoch(make(lengths, rank=r, world_size=world_size), 2) for r in range(world_size)]
    assert len({len(r) for r in ranks}) == 1  # every rank takes the same number of steps
    assert len(ranks[0]) == -(-len(full) // world_size)
    # Rank r takes every world_size-th batch of the shared list, which is padded by repeating its head.
    padded = full + full[: -len(full) % world_size]
    assert len(padded) > len(full) or len(full) % world_size == 0
    for r, batches in enumerate(ranks):
        assert batches == padded[r::world_size]
    unpadded = [b for r, batches in enumerate(ranks) for j, b in enumerate(batches)
                if r + j * world_size < len(full)]
    counts = Counter(i for b in unpadded for i in b)
    assert sorted(counts) == list(range(len(lengths[0]))) and set(counts.values()) == {1}


def test_padding_happens_when_uneven(lengths):
    n = len(list(make(lengths)))
    ws = 2 if n % 2 else 3
    assert n % ws, "pick sizes so that the batch count is not divisible"
    ranks = [list(make(lengths, rank=r, world_size=ws)) for r in range(ws)]
    all_ids = Counter(i for batches in ranks for b in batches for i in b)
    assert sum(len(r) for r in ranks) > n and max(all_ids.values()) == 2 and len(all_ids) == len(lengths[0])


def test_evaluation_ranks_see_each_example_once(lengths):
    ranks = [make(lengths, shuffle=False, pad_to_equal=False, rank=r, world_size=2) for r in range(2)]
    batches = [list(s) for s in ranks]
    assert abs(len(batches[0]) - len(batches[1])) <= 1 and [len(s) for s in ranks] == [len(b) for b in batches]
    flat = [i for bs in batches for b in bs for i in b]
    assert sorted(flat) == list(range(len(lengths[0])))


def test_drop_uneven_keeps_equal_counts_without_repeats(lengths):
    ranks = [list(make(lengths, drop_uneven=True, rank=r, world_size=3)) for r in range(3)]
    assert len({len(r) for r in ranks}) == 1
    flat = [i for r in ranks for b in r for i in b]
    assert len(flat) == len(set(flat))


def test_example_larger_than_budget_is_a_user_error():
    with pytest.raises(SeqmixError, match=r"max_tokens=10 is smaller than one example of 12 tokens"):
        TokenBudgetBatchSampler([3, 12], [4, 5], max_tokens=10)


def test_small_exact_packing():
    sampler = TokenBudgetBatchSampler([2, 2, 3, 5, 5], [2, 3, 3, 1, 5], max_tokens=10, shuffle=False)
    assert list(sampler) == [[0, 1, 2], [3, 4]]  # 3 * 3 <= 10, then 2 * 5 <= 10
    assert list(TokenBudgetBatchSampler([2] * 5, [2] * 5, max_tokens=100, max_sentences=2, shuffle=False)) == [
        [0, 1], [2, 3], [4]]
    assert len(TokenBudgetBatchSampler([], [], max_tokens=10)) == 0


def test_filter_by_length_loses_nothing_silently(lengths):
    src, tgt = lengths
    keep, skipped = filter_by_length(src, tgt, 12, 14)
    assert len(keep) + skipped == len(src) and skipped > 0
    assert (src[keep] <= 12).all() and (tgt[keep] <= 14).all()
    dropped = np.setdiff1d(np.arange(len(src)), keep)
    assert ((src[dropped] > 12) | (tgt[dropped] > 14)).all()
