"""Scoring given targets (issue 36, ``score_reference``): teacher-forced log-probabilities in float64 agree with a
loop that feeds one more token at a time through full forward passes, do not depend on the padding a batch adds,
and give a beam search hypothesis its beam score back (same length penalty convention); a language model's texts
score as the same loop and as its one-line evaluation samples."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from seqmix.data.tokenizer import train_tokenizer
from seqmix.generation.ensemble import Ensemble
from seqmix.generation.scoring import lm_token_log_probs, sentence_scores, token_log_probs
from seqmix.mixers import SelfAttention
from seqmix.models import DecoderOnly
from seqmix.tasks import LanguageModelingTask
from tests.generation.test_ensemble import BOS, EOS, PAD, VOCAB, search, src_batch, tiny_model


def targets() -> torch.Tensor:
    """Right-padded targets, each ending in eos."""
    torch.manual_seed(2)
    tgt = torch.randint(3, VOCAB, (4, 7))
    for row, length in enumerate((7, 3, 5, 1)):
        tgt[row, length - 1] = EOS
        tgt[row, length:] = PAD
    return tgt


def loop_reference(model, src_row: torch.Tensor, tgt_row: torch.Tensor) -> list[float]:
    """log p of each target token: a full forward pass over the prefix read so far, one pass per token."""
    out, prefix = [], [BOS]
    for tok in tgt_row.tolist():
        with torch.no_grad():
            logits = model(src_row.unsqueeze(0), torch.tensor([prefix]))[0, -1].double()
        out.append(float(logits[tok] - torch.logsumexp(logits, 0)))
        prefix.append(tok)
    return out


def unpadded(row: torch.Tensor) -> torch.Tensor:
    return row[row.ne(PAD)]


def test_scores_agree_with_a_token_by_token_loop_and_ignore_padding():
    model, src, tgt = tiny_model(3), src_batch(), targets()
    batch = token_log_probs(model, src, tgt, BOS, PAD)
    assert batch.dtype == torch.float64
    for i in range(src.size(0)):
        n = int(tgt[i].ne(PAD).sum())
        expected = torch.tensor(loop_reference(model, unpadded(src[i]), unpadded(tgt[i])), dtype=torch.float64)
        torch.testing.assert_close(batch[i, :n], expected, atol=1e-10, rtol=0)
        assert bool((batch[i, n:] == 0).all())
        alone = token_log_probs(model, unpadded(src[i]).unsqueeze(0), unpadded(tgt[i]).unsqueeze(0), BOS, PAD)[0]
        torch.testing.assert_close(batch[i, :n], alone, atol=1e-10, rtol=0)


def test_sentence_scores_are_length_normalized_with_eos_counted():
    positional = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.25, 0.0]], dtype=torch.float64)
    tgt = torch.tensor([[5, 6, EOS], [7, EOS, PAD]])
    got = sentence_scores(positional, tgt, PAD, len_penalty=0.6)
    torch.testing.assert_close(got, torch.tensor([-6.0 / 3**0.6, -0.75 / 2**0.6], dtype=torch.float64))


@pytest.mark.parametrize("len_penalty", [1.0, 0.6])
@pytest.mark.parametrize("members", [1, 2])
@torch.no_grad()
def test_a_beam_hypothesis_scores_its_beam_score(len_penalty, members):
    """Every returned hypothesis (not only the best), scored as a reference, gets the score beam search gave it;
    with two members, the ensemble scores as it decodes."""
    models = [tiny_model(3), tiny_model(4, layers=1)][:members]
    model = models[0] if members == 1 else Ensemble(models)
    src = src_batch()
    found = search(3, len_penalty=len_penalty).generate(model, src)
    for i, hyps in enumerate(found):
        tgt = torch.nn.utils.rnn.pad_sequence([h.tokens for h in hyps], batch_first=True, padding_value=PAD)
        rows = src[i: i + 1].expand(len(hyps), -1)
        positional = token_log_probs(model, rows, tgt, BOS, PAD)
        scores = sentence_scores(positional, tgt, PAD, len_penalty)
        for j, h in enumerate(hyps):
            assert float(scores[j]) == pytest.approx(h.score, abs=1e-5)
            torch.testing.assert_close(positional[j, : len(h.tokens)], h.positional_scores.double(), atol=1e-5,
                                       rtol=0)


def test_an_ensemble_scores_the_mean_distribution_by_hand():
    a, b = tiny_model(3), tiny_model(6)
    src, tgt = src_batch(), targets()
    got = token_log_probs(Ensemble([a, b]), src, tgt, BOS, PAD)
    for i in range(src.size(0)):
        pa, pb = (loop_reference(m, unpadded(src[i]), unpadded(tgt[i])) for m in (a, b))
        hand = [math.log((math.exp(x) + math.exp(y)) / 2) for x, y in zip(pa, pb)]
        torch.testing.assert_close(got[i, : len(hand)], torch.tensor(hand, dtype=torch.float64), atol=1e-10, rtol=0)


def tiny_lm(vocab: int, pad: int) -> DecoderOnly:
    torch.manual_seed(7)
    mix = functools.partial(SelfAttention, num_heads=2)
    return DecoderOnly(vocab, pad, 16, dict(layers=2, ffn_dim=32, mixer=mix), dropout=0.0, max_positions=64).eval()


def test_a_language_model_scores_each_text_as_a_token_by_token_loop_does_padded_or_alone():
    model = tiny_lm(VOCAB, PAD).double()
    tgt = targets()
    with torch.no_grad():
        batch = lm_token_log_probs(model, tgt, EOS, PAD)
        for i in range(tgt.size(0)):
            row = unpadded(tgt[i])
            expected = []
            for t in range(len(row)):
                logits = model.log_probs(model(torch.cat([torch.tensor([EOS]), row[:t]]).unsqueeze(0)))[0, -1]
                expected.append(float(logits[row[t]]))
            torch.testing.assert_close(batch[i, : len(row)], torch.tensor(expected, dtype=torch.float64), atol=1e-10,
                                       rtol=0)
            assert bool((batch[i, len(row):] == 0).all())
            torch.testing.assert_close(batch[i, : len(row)], lm_token_log_probs(model, row.unsqueeze(0), EOS, PAD)[0],
                                       atol=1e-10, rtol=0)


def test_a_language_model_task_scores_lines_to_the_perplexity_of_its_one_line_samples():
    """Each line scored alone is what ``break_mode=eos`` evaluation reads (every line its own sample behind </s>):
    the same perplexity through the block path."""
    texts = ["a b c d e f g h", "h g f e d c b a", "a a b", "", "c d e f g"]
    tok = train_tokenizer(texts * 10, vocab_size=40)
    task = LanguageModelingTask(tiny_lm(tok.vocab_size, tok.pad), tok, optimizer=None, tokens_per_sample=32,
                                break_mode="eos")
    corpus = task.score_texts(texts)
    _, report = task.evaluate_texts(texts)
    assert corpus.ntokens == sum(len(tok.encode(t)) + 1 for t in texts)
    assert corpus.perplexity == pytest.approx(report.score, rel=1e-5)
    for scored, text in zip(corpus.sentences, texts):
        assert len(scored.positional_scores) == len(tok.encode(text)) + 1
        assert scored.score == pytest.approx(float(scored.positional_scores.mean()), abs=1e-6)
