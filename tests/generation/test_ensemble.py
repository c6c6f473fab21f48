"""Ensembles (issue 36): beam search over an :class:`Ensemble` runs on the mean of the members' next-token
distributions, each member keeping its own encoder output and incremental state. Checked in float64 against the
model alone (an ensemble of one, of two copies), against a hand average of two models' softmaxes, and against a
full-prefix recompute of every step (which needs no state, so a wrong reorder of one member's state shows)."""

from __future__ import annotations

import copy
import functools
import math

import pytest
import torch

from seqmix.errors import SeqmixError
from seqmix.generation import BeamSearch
from seqmix.generation.ensemble import Ensemble
from seqmix.mixers import SelfAttention
from seqmix.models import EncoderDecoder

BOS, PAD, EOS, VOCAB = 0, 1, 2, 30


def tiny_model(seed: int, layers: int = 2) -> EncoderDecoder:
    torch.manual_seed(seed)
    mix = functools.partial(SelfAttention, num_heads=2)
    m = EncoderDecoder(VOCAB, VOCAB, PAD, 16, encoder=dict(layers=layers, ffn_dim=32, mixer=mix),
                       decoder=dict(layers=layers, ffn_dim=32, mixer=mix, cross_attention_heads=2), dropout=0.0)
    with torch.no_grad():  # eos likely enough that hypotheses end at various lengths (and sentences leave the batch)
        m.decoder.embed_tokens.weight[EOS] *= 3
    return m.double().eval()


def src_batch() -> torch.Tensor:
    torch.manual_seed(1)
    src = torch.randint(3, VOCAB, (4, 8))
    src[1, 5:] = PAD
    src[3, 3:] = PAD
    return src


def search(beam: int = 3, incremental: bool = True, **kw) -> BeamSearch:
    return BeamSearch(BOS, EOS, PAD, beam_size=beam, max_len_a=1.0, max_len_b=4, incremental=incremental, **kw)


def assert_same_hypotheses(got, expected, atol: float = 1e-6) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert len(a) == len(b)
        for ha, hb in zip(a, b):
            assert torch.equal(ha.tokens, hb.tokens)
            assert ha.score == pytest.approx(hb.score, abs=atol)
            torch.testing.assert_close(ha.positional_scores, hb.positional_scores, atol=atol, rtol=0)


@pytest.mark.parametrize("beam", [1, 3])
def test_an_ensemble_of_one_model_decodes_as_the_model(beam):
    model = tiny_model(3)
    assert_same_hypotheses(search(beam).generate(Ensemble([model]), src_batch()),
                           search(beam).generate(model, src_batch()))


def test_an_ensemble_of_two_copies_decodes_as_one_model():
    model = tiny_model(3)
    ensemble = Ensemble([model, copy.deepcopy(model)])
    assert_same_hypotheses(search(4, len_penalty=0.6).generate(ensemble, src_batch()),
                           search(4, len_penalty=0.6).generate(model, src_batch()))


def test_the_first_step_distribution_is_the_mean_of_the_two_softmaxes():
    a, b = tiny_model(3), tiny_model(4, layers=1)
    src = src_batch()
    ensemble = Ensemble([a, b])
    enc = ensemble.encode(src)
    start = torch.full((src.size(0), 1), BOS)
    got = ensemble.decode(start, enc, ensemble.init_decoder_state(enc))[:, -1]
    with torch.no_grad():
        pa = torch.softmax(a(src, start)[:, -1], -1)
        pb = torch.softmax(b(src, start)[:, -1], -1)
    hand = torch.log((pa + pb) / 2)  # in probability space, not through logsumexp
    torch.testing.assert_close(got, hand, atol=1e-12, rtol=0)
    assert not torch.allclose(pa, pb, atol=1e-3)  # the two models do differ
    assert got.exp().sum(-1).sub(1).abs().max() < 1e-12


def test_each_member_keeps_its_own_state_through_reorders_and_finished_sentences():
    """Incremental beam search (states reordered, sentences leaving the batch) equals recomputing every prefix."""
    ensemble = Ensemble([tiny_model(3), tiny_model(4, layers=1), tiny_model(5)])
    fast = search(4, incremental=True).generate(ensemble, src_batch())
    slow = search(4, incremental=False).generate(ensemble, src_batch())
    assert_same_hypotheses(fast, slow, atol=1e-5)
    assert len({len(h[0].tokens) for h in fast}) > 1  # sentences ended at different steps


def test_a_hypothesis_score_is_the_sum_of_the_averaged_log_probs_by_hand():
    a, b = tiny_model(3), tiny_model(6)
    src = src_batch()
    hyps = search(3).generate(Ensemble([a, b]), src)
    for i, best in enumerate(h[0] for h in hyps):
        row = src[i: i + 1, : int(src[i].ne(PAD).sum())]
        prev = torch.cat([torch.tensor([BOS]), best.tokens[:-1]]).unsqueeze(0)
        with torch.no_grad():
            probs = (torch.softmax(a(row, prev), -1) + torch.softmax(b(row, prev), -1)) / 2
        hand = [math.log(float(probs[0, t, tok])) for t, tok in enumerate(best.tokens.tolist())]
        torch.testing.assert_close(best.positional_scores.double(), torch.tensor(hand, dtype=torch.float64),
                                   atol=1e-5, rtol=0)
        assert best.score == pytest.approx(sum(hand) / len(hand), abs=1e-5)


def test_members_that_share_no_source_rows_are_given_copies_like_the_others():
    """A member without ``for_beams`` copies each source row per beam; the others then copy too, so one selection
    index (rows, not sentences) serves every member."""

    class NoSharing(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.inner = model
            self.decoder_start, self.max_target_positions = model.decoder_start, model.max_target_positions

        def encode(self, src):
            return self.inner.encode(src)

        def init_decoder_state(self, enc):
            return self.inner.init_decoder_state(enc)

        def decode(self, prev, enc, state=None):
            return self.inner.decode(prev, enc, state)

    a, b = tiny_model(3), tiny_model(4)
    mixed = search(3).generate(Ensemble([a, NoSharing(b)]), src_batch())
    assert_same_hypotheses(mixed, search(3).generate(Ensemble([a, b]), src_batch()), atol=1e-6)


def test_models_started_with_different_symbols_are_refused():
    a, b = tiny_model(3), tiny_model(4)
    b.decoder_start = "bos" if a.decoder_start == "eos" else "eos"
    with pytest.raises(SeqmixError, match="different symbols"):
        Ensemble([a, b])
