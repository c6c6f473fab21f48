"""Stepwise length penalty: the normalized score decides at every step, so the best hypothesis never gets worse
and the returned ones are the best finished ones; the search still ends, within the length bounds."""

from __future__ import annotations

import functools

import pytest
import torch

from seqmix.generation import BeamSearch, Hypothesis
from seqmix.mixers import SelfAttention
from seqmix.models import EncoderDecoder

BOS, PAD, EOS = 0, 1, 2


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(5)
    mix = functools.partial(SelfAttention, num_heads=2)
    m = EncoderDecoder(30, 30, PAD, 16, encoder=dict(layers=1, ffn_dim=32, mixer=mix),
                       decoder=dict(layers=1, ffn_dim=32, mixer=mix, cross_attention_heads=2), dropout=0.0)
    with torch.no_grad():  # eos likely early, so plain stopping ends on short hypotheses
        m.decoder.embed_tokens.weight[EOS] *= 4
    return m.eval()


def sources():
    torch.manual_seed(2)
    return torch.randint(3, 30, (6, 7))


def search(**kw):
    return BeamSearch(bos=BOS, eos=EOS, pad=PAD, beam_size=3, max_len_b=12, min_len_b=1, **kw)


@pytest.mark.parametrize("len_penalty", [0.0, 1.0, 2.0])
def test_never_worse_than_plain_stopping(model, len_penalty):
    plain = search(len_penalty=len_penalty).generate(model, sources())
    stepwise = search(len_penalty=len_penalty, stepwise_len_penalty=True).generate(model, sources())
    better = 0
    for p, s in zip(plain, stepwise):
        assert s[0].score >= p[0].score - 1e-6
        assert [h.score for h in s] == sorted((h.score for h in s), reverse=True)
        better += s[0].score > p[0].score + 1e-6
        for h in s:  # the score is the stated normalization of the summed log-probabilities
            assert h.score == pytest.approx(float(h.positional_scores.sum()) / len(h.tokens) ** len_penalty, rel=1e-5)
            assert 2 <= len(h.tokens) <= 13 and int(h.tokens[-1]) == EOS
    if len_penalty == 2.0:
        assert better > 0  # a strong penalty does prefer hypotheses that plain stopping never waited for


def test_stops_only_when_no_live_hypothesis_can_win():
    """Live cumulative log-probs only fall; with len_penalty a > 0 the best a live one can still reach is
    cum / (max_len + 1)**a, with a = 0 it is cum itself."""
    def finished(*scores):
        return [Hypothesis(torch.tensor([EOS]), s, torch.zeros(1)) for s in scores]

    max_len = torch.tensor([9, 9, 9])
    cum = torch.tensor([[-2.0, -3.0, -9.0], [-8.0, -9.0, -9.5], [-0.1, -0.2, -0.3]])
    done = BeamSearch(bos=BOS, eos=EOS, pad=PAD, beam_size=3, len_penalty=1.0, stepwise_len_penalty=True)
    fin = [finished(-0.5, -0.6, -0.7), finished(-0.5, -0.6, -0.7), finished(-0.5, -0.6)]
    assert done._cannot_improve(fin, cum, step=3, max_len=max_len).tolist() == [False, True, False]
    raw = BeamSearch(bos=BOS, eos=EOS, pad=PAD, beam_size=3, len_penalty=0.0, stepwise_len_penalty=True)
    fin = [finished(-1.0, -1.5, -2.5), finished(-1.0, -1.5, -7.0), finished(-1.0, -1.5, -2.0)]
    assert raw._cannot_improve(fin, cum, step=3, max_len=max_len).tolist() == [False, True, False]
