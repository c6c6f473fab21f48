"""LM samples: every token of a split is a target exactly once; inputs are the targets shifted right by one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqmix.data.lm_blocks import block_bounds, collate_blocks, make_blocks, token_stream
from seqmix.errors import SeqmixError

EOS, PAD = 2, 1


def lines(seed=0, n=30):
    rng = np.random.default_rng(seed)
    return [rng.integers(4, 100, size=int(rng.integers(0, 25))).tolist() for _ in range(n)]  # incl. empty lines


def scored(sample) -> torch.Tensor:
    return sample["target"][sample["target"].ne(PAD)]


@pytest.mark.parametrize("break_mode", ["none", "eos"])
@pytest.mark.parametrize("tokens_per_sample", [1, 7, 64])
def test_targets_tile_the_stream_and_inputs_shift_right(break_mode, tokens_per_sample):
    data = lines()
    ds = make_blocks(data, EOS, PAD, tokens_per_sample, break_mode)
    stream = token_stream(data, EOS)
    assert stream.tolist() == [EOS] + [t for ids in data for t in [*ids, EOS]]
    samples = [ds[i] for i in range(len(ds))]
    assert torch.equal(torch.cat([scored(s) for s in samples]), stream[1:])  # nothing lost, nothing twice
    assert ds.num_targets == len(stream) - 1
    previous_last = EOS
    for s in samples:
        assert len(s["input"]) == len(s["target"]) <= tokens_per_sample
        assert torch.equal(s["input"][1:], s["target"][:-1])
        if break_mode == "none":
            assert int(s["input"][0]) == previous_last  # blocks continue where the previous one ended
        previous_last = int(s["target"][-1])


def test_eos_mode_keeps_each_sample_inside_one_line():
    data = [[5, 6, 7], [], [8] * 10]
    ds = make_blocks(data, EOS, PAD, tokens_per_sample=4, break_mode="eos")
    got = [(ds[i]["input"].tolist(), ds[i]["target"].tolist()) for i in range(len(ds))]
    assert got == [([EOS, 5, 6, 7], [5, 6, 7, EOS]),
                   ([EOS], [EOS]),
                   ([EOS, 8, 8, 8], [8, 8, 8, 8]), ([8, 8, 8, 8], [8, 8, 8, 8]), ([8, 8, 8], [8, 8, EOS])]


def test_context_is_read_but_not_scored():
    data = lines(1)
    plain = make_blocks(data, EOS, PAD, 8, "none")
    ctx = make_blocks(data, EOS, PAD, 8, "none", context=5)
    assert len(plain) == len(ctx)
    assert torch.equal(torch.cat([scored(ctx[i]) for i in range(len(ctx))]), token_stream(data, EOS)[1:])
    first, third = ctx[0], ctx[2]
    assert len(first["input"]) == 8  # nothing before the start of the stream
    assert len(third["input"]) == 8 + 5 and third["target"][:5].eq(PAD).all()
    assert torch.equal(third["input"][5:], plain[2]["input"])
    stream, start = token_stream(data, EOS), int(ctx.ranges[2][0])
    assert torch.equal(third["input"][:5], stream[start - 6: start - 1])  # the 5 tokens before the block's input
    assert ctx.sizes.tolist() == [len(ctx[i]["input"]) for i in range(len(ctx))]


def test_collate_pads_both_sides_and_counts_scored_tokens():
    ds = make_blocks([[5, 6, 7, 8], [9]], EOS, PAD, 3, "eos", context=0)
    batch = collate_blocks([ds[0], ds[2]], PAD)  # [EOS 5 6] and [EOS 9]
    assert batch["tokens"].tolist() == [[EOS, 5, 6], [EOS, 9, PAD]]
    assert batch["target"].tolist() == [[5, 6, 7], [9, EOS, PAD]]
    assert batch["ntokens"] == int(batch["target"].ne(PAD).sum())
    assert batch["id"].tolist() == [0, 2]


def test_block_bounds_checks_its_settings():
    starts, ends, sizes = block_bounds(np.array([1, 4, 8]), 5)  # lines of 3 and 4 tokens (eos included)
    assert starts.tolist() == [1, 6] and ends.tolist() == [6, 8] and sizes.tolist() == [5, 2]
    with pytest.raises(SeqmixError, match="tokens_per_sample"):
        block_bounds(np.array([1, 4]), 0)
    with pytest.raises(SeqmixError, match="break_mode"):
        block_bounds(np.array([1, 4]), 4, "sentence")


def eos_reference(data, tokens_per_sample):
    """Independently: each line alone as ``[eos] + line`` -> ``line + [eos]``, cut every ``tokens_per_sample``."""
    out = []
    for ids in data:
        inp, tgt = [EOS, *ids], [*ids, EOS]
        for a in range(0, len(tgt), tokens_per_sample):
            out.append((inp[a: a + tokens_per_sample], tgt[a: a + tokens_per_sample]))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("tokens_per_sample", [1, 5, 16, 100])
def test_eos_mode_models_every_line_alone(seed, tokens_per_sample):
    """break_mode=eos (lm1b, Wu et al. 2019 §5.2): no sample reads a token of another line, so a line's samples
    are the same whatever the other lines are."""
    data = lines(seed, n=40)
    ds = make_blocks(data, EOS, PAD, tokens_per_sample, "eos")
    got = [(ds[i]["input"].tolist(), ds[i]["target"].tolist()) for i in range(len(ds))]
    assert got == eos_reference(data, tokens_per_sample)
    for inp, tgt in got:
        assert EOS not in inp[1:] and EOS not in tgt[:-1]  # never across a boundary
    shuffled = [data[i] for i in np.random.default_rng(seed).permutation(len(data))]
    other = make_blocks(shuffled, EOS, PAD, tokens_per_sample, "eos")
    key = sorted((ds[i]["input"].tolist(), ds[i]["target"].tolist()) for i in range(len(ds)))
    assert key == sorted((other[i]["input"].tolist(), other[i]["target"].tolist()) for i in range(len(other)))


@pytest.mark.parametrize("context", [1, 3, 50])
@pytest.mark.parametrize("tokens_per_sample", [1, 4, 9])
def test_context_scores_each_token_once_with_the_history_it_promises(context, tokens_per_sample):
    """eval_context: every target once, and the input ending at a scored token holds exactly the
    min(context + offset-in-block, position) tokens before it, read straight from the stream."""
    data = lines(3)
    ds = make_blocks(data, EOS, PAD, tokens_per_sample, "none", context=context)
    stream = token_stream(data, EOS)
    seen = []
    for i in range(len(ds)):
        s = ds[i]
        a, b = (int(v) for v in ds.ranges[i])
        c = min(a - 1, context)
        assert torch.equal(s["input"], stream[a - 1 - c: b - 1])
        assert s["target"][:c].eq(PAD).all() and torch.equal(s["target"][c:], stream[a:b])
        seen += list(range(a, b))
    assert seen == list(range(1, len(stream)))


def test_context_is_refused_in_eos_mode():
    """With break_mode=eos earlier context would cross into other lines (it used to, silently, in
    generate.py eval_context=N on an lm1b model)."""
    with pytest.raises(SeqmixError, match="break_mode=none"):
        make_blocks([[5, 6], [7]], EOS, PAD, 4, "eos", context=2)
    assert len(make_blocks([[5, 6], [7]], EOS, PAD, 4, "eos", context=0)) == 2
