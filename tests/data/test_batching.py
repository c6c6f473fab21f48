import itertools
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


def reference_batches(src, tgt, max_tokens, max_sentences=None, shuffle=True, seed=1, epoch=0, rank=0,
                      world_size=1):
    """The original per-example implementation, kept as an independent oracle for the vectorized one."""
    src, tgt = np.asarray(src, dtype=np.int64), np.asarray(tgt, dtype=np.int64)
    sizes = np.maximum(src, tgt)
    n = len(sizes)

    def rng(stream):
        return np.random.default_rng([seed, epoch, stream])

    order = rng(0).permutation(n) if shuffle else np.arange(n)
    order = order[np.lexsort((src[order], tgt[order], sizes[order]))]
    batches, current, longest = [], [], 0
    cap = max_sentences or n
    for i in order.tolist():
        size = int(sizes[i])
        grown = max(longest, size)
        if current and (len(current) + 1 > cap or (len(current) + 1) * grown > max_tokens):
            batches.append(current)
            current, grown = [], size
        current.append(i)
        longest = grown
    if current:
        batches.append(current)
    if shuffle:
        batches = [batches[j] for j in rng(1).permutation(len(batches))]
    if world_size > 1 and batches:
        missing = -len(batches) % world_size
        batches = batches + [batches[j % len(batches)] for j in range(missing)]
        batches = batches[rank::world_size]
    return batches


def _cases():
    """(src, tgt, max_tokens, max_sentences): size spreads, tie-heavy runs, budget-sized examples, zero lengths,
    lengths past 255 and 65535 (wider sort keys), a single example and none; several input dtypes."""
    rng = np.random.default_rng(0)
    wmt = np.clip(rng.lognormal(2.5, 0.6, (2, 3000)), 1, 120).astype(np.uint16)
    ties = rng.integers(1, 6, (2, 800)).astype(np.uint8)
    at_budget = rng.integers(1, 51, (2, 600)).astype(np.int32)
    at_budget[0, ::5] = 50  # size == max_tokens: one example per batch
    # Every (src, tgt) in [0, 20]^2, and enough empty pairs for max_sentences to cut their batches.
    pairs = np.array(list(itertools.product(range(21), repeat=2)) * 3 + [(0, 0)] * 9).T
    long = rng.integers(1, 3000, (2, 1500))
    very_long = rng.integers(60_000, 70_000, (2, 300)).astype(np.uint32)
    return {
        "wmt-like": (wmt[0], wmt[1], 512, None),
        "wmt-like-max-sentences": (wmt[0], wmt[1], 512, 8),
        "ties": (ties[0], ties[1], 12, 3),
        "ties-no-cap": (ties[0], ties[1], 40, None),
        "at-budget": (at_budget[0], at_budget[1], 50, 16),
        "all-pairs-with-zeros": (pairs[0], pairs[1], 40, 5),
        "all-pairs-uncapped": (pairs[0], pairs[1], 40, None),
        "lengths-past-255": (long[0], long[1], 6000, None),
        "lengths-past-65535": (very_long[0], very_long[1], 140_000, None),
        "single": ([7], [3], 10, None),
        "empty": (np.zeros(0, np.uint16), np.zeros(0, np.uint16), 10, None),
    }


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_matches_reference_implementation(case):
    src, tgt, max_tokens, max_sentences = CASES[case]
    for world_size, shuffle in itertools.product((1, 2, 3), (True, False)):
        for rank in range(world_size):
            kw = {"max_tokens": max_tokens, "max_sentences": max_sentences, "shuffle": shuffle, "seed": 7,
                  "rank": rank, "world_size": world_size}
            sampler = TokenBudgetBatchSampler(src, tgt, **kw)
            for e in (0, 2, 0):  # back to 0: the per-epoch cache must follow the epoch
                sampler.set_epoch(e)
                expected = reference_batches(src, tgt, epoch=e, **kw)
                assert len(sampler) == len(expected)
                assert list(sampler) == expected


def test_matches_reference_on_multi30k(lengths):
    settings = [(1, {}), (2, {}), (3, {}), (2, {"shuffle": False})]
    for world_size, flag in settings:
        for rank, e in itertools.product(range(world_size), (0, 1)):
            kw = {"max_tokens": MAX_TOKENS, "max_sentences": MAX_SENTENCES, "seed": 3, "rank": rank,
                  "world_size": world_size, **flag}
            sampler = make(lengths, **kw)
            sampler.set_epoch(e)
            expected = reference_batches(*lengths, epoch=e, **kw)
            assert len(expected) > 100 and len(sampler) == len(expected) and list(sampler) == expected


def test_compact_inputs_are_used_without_copies(tmp_path):
    rng = np.random.default_rng(5)
    src = np.memmap(tmp_path / "src.bin", dtype=np.uint16, mode="w+", shape=(5000,))
    src[:] = rng.integers(1, 300, len(src))
    tgt = rng.integers(1, 200, len(src)).astype(np.int32)
    sampler = TokenBudgetBatchSampler(src, tgt, max_tokens=2048, seed=2)
    assert np.shares_memory(sampler.src_lengths, src) and np.shares_memory(sampler.tgt_lengths, tgt)
    assert sampler.sizes.dtype == np.uint16 and np.array_equal(sampler.sizes, np.maximum(src, tgt))
    assert TokenBudgetBatchSampler(tgt % 256, tgt % 200, max_tokens=2048).sizes.dtype == np.uint8
    assert list(sampler) == reference_batches(np.array(src), tgt, max_tokens=2048, seed=2)


def test_negative_lengths_are_rejected():
    with pytest.raises(ValueError, match="must be >= 0"):
        TokenBudgetBatchSampler([3, -1], [4, 5], max_tokens=10)


def test_a_loaded_state_resumes_the_epoch_after_its_trained_batches(lengths):
    full = [epoch(make(lengths), e) for e in (2, 3)]
    saved = make(lengths)
    saved.set_epoch(2)
    resumed = make(lengths)  # a new process: epoch 0 until the checkpoint's state arrives
    resumed.load_state_dict(saved.state_dict(trained=5))
    assert list(resumed) == full[0][5:]
    assert list(resumed) == full[0][5:]  # another iterator of the resumed epoch skips the same batches
    resumed.set_epoch(3)
    assert list(resumed) == full[1]


def test_a_state_saved_after_the_epochs_last_batch_resumes_with_the_next_epoch(lengths):
    saved = make(lengths)
    saved.set_epoch(4)
    resumed = make(lengths)
    resumed.load_state_dict(saved.state_dict(trained=len(saved)))
    assert list(resumed) == epoch(make(lengths), 5)
    resumed.set_epoch(5)  # what Lightning then says
    assert list(resumed) == epoch(make(lengths), 5)


def test_a_state_from_other_batches_restarts_the_epoch_with_a_warning(lengths, caplog):
    saved = make(lengths, max_tokens=MAX_TOKENS // 2)
    saved.set_epoch(1)
    resumed = make(lengths)
    with caplog.at_level("WARNING"):
        resumed.load_state_dict(saved.state_dict(trained=3))
    assert "max_tokens 500 -> 1000" in caplog.text
    assert epoch(resumed, 1) == epoch(make(lengths), 1)
