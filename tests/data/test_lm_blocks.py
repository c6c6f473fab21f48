"""LM samples: every token of a split is a target exactly once; inputs are the targets shifted right by one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from seqmix.data.lm_blocks import block_ranges, collate_blocks, make_blocks, token_stream
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


def test_block_ranges_checks_its_settings():
    assert block_ranges([3, 4], 5).tolist() == [[1, 6], [6, 8]]
    with pytest.raises(SeqmixError, match="tokens_per_sample"):
        block_ranges([3], 0)
    with pytest.raises(SeqmixError, match="break_mode"):
        block_ranges([3], 4, "sentence")
