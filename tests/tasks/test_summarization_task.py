"""SummarizationTask: trigram blocking in its decoding, ROUGE + lead baseline as rouge-score computes them."""

from __future__ import annotations

import functools

import torch

from seqmix.data.tokenizer import train_tokenizer
from seqmix.metrics import corpus_rouge, lead
from seqmix.mixers import LightConv
from seqmix.models import EncoderDecoder
from seqmix.tasks import SummarizationTask

DOCS = ["The cat sat on the mat. It was warm. Then it slept. The end.",
        "A dog ran in the park! It barked at birds. Nobody minded.",
        "#Person1#: Hello, how are you?\n#Person2#: Fine, thanks. And you?\n#Person1#: Good."]
REFS = [["A cat sat and slept."], ["A dog ran and barked.", "The dog barked at birds."], ["Two people greet."]]


def task(**generation):
    tok = train_tokenizer(DOCS + [r for refs in REFS for r in refs], vocab_size=120, min_frequency=1)
    torch.manual_seed(0)
    mix = functools.partial(LightConv, num_heads=2, kernel_size=3)
    model = EncoderDecoder(tok.vocab_size, tok.vocab_size, tok.pad, 16, encoder=dict(layers=1, ffn_dim=32, mixer=mix),
                           decoder=dict(layers=1, ffn_dim=32, mixer=mix, cross_attention_heads=2), dropout=0.0)
    return SummarizationTask(model.eval(), tok, optimizer=torch.optim.Adam, generation=generation,
                             rouge={"stemming": True, "lead": 2})


def trigrams(tokens: list[int]) -> list[tuple]:
    return [tuple(tokens[i: i + 3]) for i in range(len(tokens) - 2)]


def test_trigram_blocking_never_repeats_a_trigram():
    opts = dict(beam_size=4, min_len_b=40, max_len_b=50, stepwise_len_penalty=True, len_penalty=1.5)
    t = task(no_repeat_ngram_size=3, **opts)
    rows = [torch.tensor(t.tokenizer.encode(d) + [t.tokenizer.eos]) for d in DOCS[:2]]
    src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=t.tokenizer.pad)
    blocked = t.beam_search().generate(t.model, src)
    free = t.beam_search(no_repeat_ngram_size=0).generate(t.model, src)
    assert any(len(set(trigrams(h.tokens.tolist()))) < len(trigrams(h.tokens.tolist())) for hs in free for h in hs)
    for hyps in blocked:
        for h in hyps:
            grams = trigrams(h.tokens.tolist())
            assert len(grams) >= 38 and len(set(grams)) == len(grams)


def test_rouge_and_lead_baseline_as_rouge_score_computes_them():
    t = task(beam_size=2, max_len_b=10, no_repeat_ngram_size=3)
    hyps, report = t.evaluate_texts(DOCS, REFS, max_tokens=500)
    assert len(hyps) == 3
    norm = t.tokenizer.normalize_reference
    refs = [[norm(r) for r in rs] for rs in REFS]
    model = corpus_rouge(hyps, refs, stemming=True)
    baseline = corpus_rouge([norm(lead(d, 2)) for d in DOCS], refs, stemming=True)
    assert report.score == model.rougeL
    assert report.headline == f"ROUGE-1/2/L: {model.scores()}"
    assert report.metrics == {"rouge1": model.rouge1, "rouge2": model.rouge2, "rougeL": model.rougeL}
    assert f"lead-2 baseline: {baseline}" in report.details
    assert baseline.rouge1 > 20  # the lead sentences share words with the references


def test_long_documents_are_truncated_not_rejected():
    t = task(beam_size=1, max_len_b=3)
    t.model.max_source_positions = 8
    hyps, report = t.evaluate_texts([DOCS[0] * 5], None, max_tokens=500)
    assert len(hyps) == 1 and report is None
