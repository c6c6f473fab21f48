"""ROUGE equals rouge-score called directly (one and several references); lead-N; perplexity."""

from __future__ import annotations

import math

import pytest
from rouge_score import rouge_scorer

from seqmix.metrics import corpus_rouge, lead, perplexity

HYPS = ["the cats were sitting on the mat", "a dog runs in the park today", ""]
REFS = [["the cat sat on the mat", "cats sit on mats"], ["dogs run in parks"], ["nothing at all"]]


@pytest.mark.parametrize("stemming", [True, False])
def test_rouge_equals_rouge_score_directly(stemming):
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=stemming)
    expect = {t: 0.0 for t in ("rouge1", "rouge2", "rougeL")}
    for hyp, refs in zip(HYPS, REFS):
        for t in expect:  # multi-reference: the best F1 over the references, per type
            expect[t] += max(scorer.score(ref, hyp)[t].fmeasure for ref in refs) / len(HYPS) * 100
    result = corpus_rouge(HYPS, REFS, stemming=stemming)
    assert result.rouge1 == pytest.approx(expect["rouge1"], abs=1e-9)
    assert result.rouge2 == pytest.approx(expect["rouge2"], abs=1e-9)
    assert result.rougeL == pytest.approx(expect["rougeL"], abs=1e-9)
    assert result.n == 3 and result.refs_per_example == pytest.approx(4 / 3)


def test_stemming_matters_and_is_reported():
    on, off = corpus_rouge(HYPS[:1], REFS[:1], True), corpus_rouge(HYPS[:1], REFS[:1], False)
    assert on.rouge1 > off.rouge1
    assert "stemming on" in str(on) and "stemming off" in str(off)


def test_rouge_input_errors():
    with pytest.raises(ValueError, match="reference"):
        corpus_rouge(["a"], [["a"], ["b"]])
    with pytest.raises(ValueError, match="at least one"):
        corpus_rouge(["a"], [[]])


def test_lead_takes_first_sentences_and_turns():
    text = "First one. Second one! Third? Fourth.\n#Person2#: fifth"
    assert lead(text, 2) == "First one. Second one!"
    assert lead("#Person1#: Hi there\n#Person2#: Hello. Bye.", 2) == "#Person1#: Hi there #Person2#: Hello."
    assert lead("one sentence only", 3) == "one sentence only"


def test_perplexity_is_exp_of_mean_nll():
    assert perplexity(10 * math.log(50.0), 10) == pytest.approx(50.0)
    assert perplexity(1e6, 1) == math.inf and math.isnan(perplexity(0.0, 0))
