"""Sampling on beam search's loop, forced prefixes and language-model continuation (issue 36): top_k=1 and a tiny
top_p sample exactly what greedy search finds; the sampled distribution is softmax(log p / T) cut as documented
(checked against a float64 hand version and by counting first tokens); a seed repeats the draws; a sample's scores
are the model's teacher-forced log-probs of its tokens; a forced prefix starts every hypothesis and K=0 changes
nothing; a language model's greedy continuation equals a hand loop over the whole prefix."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from seqmix.generation import BeamSearch
from seqmix.generation.continuation import PromptedLanguageModel
from seqmix.generation.options import SamplingOptions
from seqmix.generation.sampling import Sampler, sampling_log_probs
from seqmix.generation.scoring import token_log_probs
from seqmix.mixers import SelfAttention
from seqmix.models import EncoderDecoder
from seqmix.models.decoder_only import DecoderOnly

BOS, PAD, EOS = 0, 1, 2
V = 30


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(3)
    mix = functools.partial(SelfAttention, num_heads=2)
    m = EncoderDecoder(V, V, PAD, 16, encoder=dict(layers=2, ffn_dim=32, mixer=mix),
                       decoder=dict(layers=2, ffn_dim=32, mixer=mix, cross_attention_heads=2), dropout=0.0)
    with torch.no_grad():
        m.decoder.embed_tokens.weight[EOS] *= 3
    return m.eval()


def sources():
    torch.manual_seed(1)
    src = torch.randint(3, V, (4, 8))
    src[1, 5:] = PAD
    src[3, 3:] = PAD
    return src


def same(a, b, exact: bool = True):
    """The same hypotheses; ``exact=False``: scores to 1e-5 (other batch shapes round differently)."""
    assert len(a) == len(b)
    for ha, hb in zip(a, b):
        assert torch.equal(ha.tokens, hb.tokens)
        if exact:
            assert ha.score == hb.score
            assert torch.equal(ha.positional_scores, hb.positional_scores)
        else:
            assert ha.score == pytest.approx(hb.score, abs=1e-5)
            torch.testing.assert_close(ha.positional_scores, hb.positional_scores, atol=1e-5, rtol=1e-5)


KW = dict(bos=BOS, eos=EOS, pad=PAD, max_len_a=1.0, max_len_b=6, len_penalty=1.0)


@pytest.mark.parametrize("options", [SamplingOptions(top_k=1, seed=0), SamplingOptions(top_p=1e-6, seed=5),
                                     SamplingOptions(top_k=1, temperature=7.0)])
def test_a_sample_without_choice_is_the_greedy_hypothesis(model, options):
    greedy = BeamSearch(beam_size=1, **KW).generate(model, sources())
    sampled = Sampler(sampling=options, nbest=1, **KW).generate(model, sources())
    for g, s in zip(greedy, sampled):
        same(g, s)
    three = Sampler(sampling=options, nbest=3, **KW).generate(model, sources())
    for g, s in zip(greedy, three):  # three samples of a one-token choice: the greedy hypothesis thrice
        assert len(s) == 3
        for h in s:
            same(g, [h], exact=False)


def hand_filtered(lprobs: torch.Tensor, top_k: int, top_p: float, temperature: float) -> torch.Tensor:
    """float64, one row at a time, by sorting: the distribution the docs promise."""
    out = []
    for row in lprobs.double():
        p = torch.softmax(row / temperature, 0)
        order = sorted(range(len(p)), key=lambda i: -float(p[i]))
        kept = order[:top_k] if top_k else order
        q = torch.zeros_like(p)
        q[kept] = p[kept] / p[kept].sum()
        total, final = 0.0, []
        for i in sorted(kept, key=lambda i: -float(q[i])):
            if total >= top_p:
                break
            final.append(i)
            total += float(q[i])
        r = torch.zeros_like(p)
        r[final] = q[final] / q[final].sum()
        out.append(r)
    return torch.stack(out)


@pytest.mark.parametrize("top_k, top_p, temperature", [(0, 1.0, 1.0), (5, 1.0, 1.0), (0, 0.7, 1.0),
                                                       (4, 0.5, 0.6), (0, 0.9, 2.5), (1, 1.0, 0.3)])
def test_the_filtered_distribution_matches_a_float64_hand_version(top_k, top_p, temperature):
    torch.manual_seed(0)
    lprobs = torch.log_softmax(torch.randn(6, 12) * 2, -1)
    got = sampling_log_probs(lprobs, SamplingOptions(top_k, top_p, temperature)).exp().double()
    want = hand_filtered(lprobs, top_k, top_p, temperature)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert bool((got.gt(0).sum(1) <= (top_k or 12)).all())


def test_first_token_frequencies_follow_the_tempered_distribution(model):
    """20,000 one-token samples of one source: frequencies within 4 standard errors of softmax(log p / T)."""
    src = sources()[:1]
    temperature, n = 1.7, 20000
    with torch.no_grad():
        logits = model.decode(torch.tensor([[BOS]]), model.encode(src))[0, -1]
    lp = torch.log_softmax(logits.double(), -1)
    lp[[PAD, BOS, EOS]] = -math.inf  # pad and bos are never moves; eos is banned by min_len_b=1
    want = torch.softmax(lp / temperature, -1)
    sampler = Sampler(BOS, EOS, PAD, sampling=SamplingOptions(temperature=temperature, seed=0), nbest=n,
                      max_len_b=1, min_len_b=1)
    hyps = sampler.generate(model, src)[0]
    first = torch.tensor([int(h.tokens[0]) for h in hyps])
    freq = torch.bincount(first, minlength=V).double() / n
    se = (want * (1 - want) / n).sqrt()
    assert bool(((freq - want).abs() <= 4 * se + 1e-9).all()), (freq, want)
    assert freq[[PAD, BOS, EOS]].sum() == 0


def test_a_seed_repeats_the_samples_and_another_seed_does_not(model):
    def draw(seed):
        return Sampler(sampling=SamplingOptions(top_k=10, seed=seed), nbest=4, **KW).generate(model, sources())
    a, b, c = draw(11), draw(11), draw(12)
    for x, y in zip(a, b):
        same(x, y)
    assert any(not torch.equal(x.tokens, y.tokens) for xs, ys in zip(a, c) for x, y in zip(xs, ys))


def test_sample_scores_are_the_teacher_forced_log_probs_of_the_sampled_tokens(model):
    src = sources()
    out = Sampler(sampling=SamplingOptions(temperature=1.5, top_p=0.9, seed=3), nbest=3, **KW).generate(model, src)
    for i, hyps in enumerate(out):
        for h in hyps:
            with torch.no_grad():
                forced = token_log_probs(model, src[i: i + 1], h.tokens.unsqueeze(0), BOS, PAD)[0]
            torch.testing.assert_close(h.positional_scores, forced, atol=1e-5, rtol=1e-5)
            assert h.score == pytest.approx(float(forced.sum()) / len(h.tokens), abs=1e-5)


def prefixes():
    p = torch.full((4, 3), PAD)
    p[0] = torch.tensor([5, 6, 7])
    p[1, :1] = 9
    p[3, :2] = torch.tensor([EOS + 20, 4])  # row 2: no prefix
    return p


@pytest.mark.parametrize("beam", [1, 3])
def test_a_forced_prefix_starts_every_hypothesis_with_the_model_scores_of_its_tokens(model, beam):
    src, prefix = sources(), prefixes()
    out = BeamSearch(beam_size=beam, **KW).generate(model, src, prefix)
    free = BeamSearch(beam_size=beam, **KW).generate(model, src)
    for i, hyps in enumerate(out):
        want = [t for t in prefix[i].tolist() if t != PAD]
        assert len(hyps) == beam
        for h in hyps:
            assert h.tokens[: len(want)].tolist() == want
            with torch.no_grad():
                forced = token_log_probs(model, src[i: i + 1], h.tokens.unsqueeze(0), BOS, PAD)[0]
            torch.testing.assert_close(h.positional_scores, forced, atol=1e-5, rtol=1e-5)
    same(out[2], free[2])  # no prefix: what free decoding finds
    empty = BeamSearch(beam_size=beam, **KW).generate(model, src, torch.full((4, 0), PAD))
    for a, b in zip(empty, free):
        same(a, b)


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(4)
    mix = functools.partial(SelfAttention, num_heads=2)
    m = DecoderOnly(V, PAD, 16, dict(layers=2, ffn_dim=32, mixer=mix), dropout=0.0, max_positions=64)
    return m.eval()


def test_greedy_continuation_equals_a_hand_loop_over_the_whole_prefix(lm):
    prompts = [[5, 6, 7, 8], [9], [], [4, 4, 11]]
    prefix = torch.full((4, 4), PAD)
    for i, p in enumerate(prompts):
        prefix[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    search = BeamSearch(BOS, EOS, PAD, beam_size=1, max_len_b=7, min_len_b=1, start=EOS, max_target_positions=64)
    out = search.generate(PromptedLanguageModel(lm), prefix.clone(), prefix, context=True)
    for prompt, hyps in zip(prompts, out):
        seq, scores = [EOS, *prompt], []
        with torch.no_grad():
            for step in range(8):  # at most max_len_b new tokens, then eos
                lp = lm.log_probs(lm(torch.tensor([seq])))[0, -1].double()
                lp[[PAD, BOS]] = -math.inf
                if step < 1:
                    lp[EOS] = -math.inf
                if step == 7:
                    keep = lp[EOS].clone()
                    lp[:] = -math.inf
                    lp[EOS] = keep
                tok = int(lp.argmax())
                scores.append(float(lp[tok]))
                seq.append(tok)
                if tok == EOS:
                    break
        assert hyps[0].tokens.tolist() == seq[1 + len(prompt):]
        assert hyps[0].positional_scores.tolist() == pytest.approx(scores, abs=1e-5)
        assert hyps[0].score == pytest.approx(sum(scores) / len(scores), abs=1e-5)


def test_a_sampled_continuation_with_top_k_1_is_the_greedy_one_and_beams_rank_continuations(lm):
    prefix = torch.tensor([[5, 6, PAD], [7, 8, 9]])
    kw = dict(bos=BOS, eos=EOS, pad=PAD, max_len_b=6, start=EOS, max_target_positions=64)
    wrapped = PromptedLanguageModel(lm)
    greedy = BeamSearch(beam_size=1, **kw).generate(wrapped, prefix.clone(), prefix, context=True)
    sampled = Sampler(sampling=SamplingOptions(top_k=1), **kw).generate(wrapped, prefix.clone(), prefix, context=True)
    for g, s in zip(greedy, sampled):
        same(g, s)
    beams = BeamSearch(beam_size=3, **kw).generate(wrapped, prefix.clone(), prefix, context=True)
    for hyps in beams:
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert all(len(h.tokens) <= 7 for h in hyps)  # max_len_b counts new tokens, not the prompt
