"""Beam search: incremental == recompute-the-prefix, greedy == argmax, constraints hold."""

from __future__ import annotations

import functools

import pytest
import torch

from seqmix.generation import BeamSearch, ban_repeated_ngrams
from seqmix.mixers import SelfAttention
from seqmix.models import EncoderDecoder

BOS, PAD, EOS = 0, 1, 2


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    mix = functools.partial(SelfAttention, num_heads=2)
    m = EncoderDecoder(30, 30, PAD, 16, encoder=dict(layers=2, ffn_dim=32, mixer=mix),
                       decoder=dict(layers=2, ffn_dim=32, mixer=mix, cross_attention_heads=2), dropout=0.0)
    with torch.no_grad():  # make eos likely enough that hypotheses end at various lengths
        m.decoder.embed_tokens.weight[EOS] *= 3
    return m.eval()


def src_batch():
    torch.manual_seed(1)
    src = torch.randint(3, 30, (4, 8))
    src[1, 5:] = PAD
    src[3, 3:] = PAD
    return src


@pytest.mark.parametrize("beam", [1, 4])
@pytest.mark.parametrize("no_repeat", [0, 2])
@pytest.mark.parametrize("len_penalty", [1.0, 0.6])
def test_incremental_equals_full_prefix_recompute(model, beam, no_repeat, len_penalty):
    kw = dict(bos=BOS, eos=EOS, pad=PAD, beam_size=beam, max_len_a=1.0, max_len_b=4,
              no_repeat_ngram_size=no_repeat, len_penalty=len_penalty)
    fast = BeamSearch(incremental=True, **kw).generate(model, src_batch())
    slow = BeamSearch(incremental=False, **kw).generate(model, src_batch())
    assert len(fast) == 4
    for a, b in zip(fast, slow):
        assert len(a) == len(b) == beam
        for ha, hb in zip(a, b):
            assert torch.equal(ha.tokens, hb.tokens)
            assert ha.score == pytest.approx(hb.score, abs=1e-5)
            torch.testing.assert_close(ha.positional_scores, hb.positional_scores, atol=1e-5, rtol=1e-5)


def test_scores_are_model_log_probs(model):
    """Recompute each returned hypothesis' log-probability with one teacher-forced pass."""
    src = src_batch()
    out = BeamSearch(bos=BOS, eos=EOS, pad=PAD, beam_size=3, max_len_b=6, len_penalty=1.0).generate(model, src)
    for i, hyps in enumerate(out):
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        for h in hyps:
            prev = torch.cat([torch.tensor([BOS]), h.tokens[:-1]]).unsqueeze(0)
            lp = torch.log_softmax(model(src[i: i + 1, : int(src[i].ne(PAD).sum())], prev).float(), -1)[0]
            tok_lp = lp.gather(1, h.tokens.unsqueeze(1)).squeeze(1)
            torch.testing.assert_close(h.positional_scores, tok_lp, atol=1e-4, rtol=1e-4)
            assert h.score == pytest.approx(tok_lp.sum().item() / len(h.tokens), abs=1e-4)
            assert h.tokens[-1].item() == EOS and (h.tokens[:-1] != EOS).all()


def test_greedy_is_argmax_decoding(model):
    src = src_batch()[:1]
    out = BeamSearch(bos=BOS, eos=EOS, pad=PAD, beam_size=1, max_len_b=6).generate(model, src)[0][0]
    prev = [BOS]
    while True:
        logits = model(src, torch.tensor([prev]))[0, -1]
        logits[PAD] = logits[BOS] = float("-inf")
        if len(prev) - 1 == 6:  # max_len_b: only eos is allowed
            nxt = EOS
        else:
            nxt = int(logits.argmax())
        prev.append(nxt)
        if nxt == EOS:
            break
    assert out.tokens.tolist() == prev[1:]


def test_length_bounds_per_sentence(model):
    src = src_batch()
    search = BeamSearch(bos=BOS, eos=EOS, pad=PAD, beam_size=2, max_len_a=0.5, max_len_b=1, min_len_b=2)
    min_len, max_len = search.length_bounds(src)
    out = search.generate(model, src)
    for hyps, lo, hi in zip(out, min_len.tolist(), max_len.tolist()):
        for h in hyps:
            n = len(h.tokens) - 1  # without eos
            assert lo <= n <= hi


def test_no_repeat_ngram_never_repeats(model):
    out = BeamSearch(bos=BOS, eos=EOS, pad=PAD, beam_size=4, max_len_b=25, min_len_b=20,
                     no_repeat_ngram_size=3).generate(model, src_batch())
    for hyps in out:
        for h in hyps:
            toks = h.tokens.tolist()
            grams = [tuple(toks[i: i + 3]) for i in range(len(toks) - 2)]
            assert len(grams) == len(set(grams))


def test_ban_repeated_ngrams_unit():
    lprobs = torch.zeros(1, 10)
    ban_repeated_ngrams(lprobs, torch.tensor([[5, 6, 7, 5, 6]]), 3)
    assert lprobs[0, 7] == float("-inf") and torch.isfinite(lprobs[0, torch.arange(10) != 7]).all()


@pytest.mark.parametrize("beam", [1, 3])
def test_decoding_starts_from_the_given_start_symbol(model, beam):
    """``start`` (eos for fairseq-trained models) is the first decoder input; bos stays banned as an output; the
    scores are those of the start-prefixed teacher-forced pass."""
    src = src_batch()
    out = BeamSearch(bos=BOS, eos=EOS, pad=PAD, beam_size=beam, max_len_b=5, len_penalty=0.0, start=EOS).generate(
        model, src)
    for i, hyps in enumerate(out):
        for h in hyps:
            assert BOS not in h.tokens.tolist()
            prev = torch.cat([torch.tensor([EOS]), h.tokens[:-1]]).unsqueeze(0)
            with torch.no_grad():
                lprobs = torch.log_softmax(model(src[i: i + 1], prev)[0].float(), dim=-1)
            expected = lprobs.gather(1, h.tokens.unsqueeze(1)).squeeze(1)
            torch.testing.assert_close(h.positional_scores, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("vocab", [3, 7, 50])
def test_candidates_are_the_best_2k_over_every_row_and_token(vocab):
    """The best 2k extensions of a sentence, searched among each row's own best 2k tokens, are the best 2k of all
    its rows' tokens: the same cumulative scores, each the parent row's cum plus that row's log-prob of the token."""
    from seqmix.generation.beam_search import _Beams

    torch.manual_seed(vocab)
    bsz, k = 3, 4
    search = BeamSearch(bos=BOS, eos=EOS, pad=PAD, beam_size=k)
    lprobs = torch.randn(bsz * k, vocab).log_softmax(-1)
    lprobs[0, :] = -float("inf")  # a row with nothing allowed
    lprobs[5, 1:] = -float("inf")  # a row with one move left
    cum = torch.randn(bsz, k) * 3
    cum[1, 1:] = -float("inf")  # step 0: one live row
    beams = _Beams(torch.zeros(bsz * k, 2, dtype=torch.long), torch.zeros(bsz * k, 1), cum,
                   torch.zeros(bsz, dtype=torch.bool), torch.zeros(bsz * k), torch.zeros(bsz * k), torch.zeros(bsz),
                   [[] for _ in range(bsz)])
    scores, tokens, rows = search._candidates(beams, lprobs)
    every = (cum.view(-1, 1) + lprobs).view(bsz, k * vocab)
    want = every.topk(min(2 * k, k * vocab), dim=1).values
    assert torch.equal(scores, want)
    finite = scores.isfinite()
    assert torch.equal(scores[finite], (cum.view(-1)[rows] + lprobs[rows, tokens])[finite])
    assert bool((rows // k == torch.arange(bsz).unsqueeze(1)).all())  # parents are the sentence's own rows
