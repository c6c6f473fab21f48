"""ROUGE equals rouge-score called directly (one and several references, sentence- and summary-level ROUGE-L);
lead-N; perplexity."""

from __future__ import annotations

import math

import pytest
from rouge_score import rouge_scorer

from seqmix.metrics import corpus_rouge, lead, perplexity
from seqmix.metrics.rouge import sentences

HYPS = ["the cats were sitting on the mat", "a dog runs in the park today", ""]
REFS = [["the cat sat on the mat", "cats sit on mats"], ["dogs run in parks"], ["nothing at all"]]

# multi-sentence summaries: summary-level ROUGE-L (union LCS per reference sentence) differs from sentence-level
HYPS_MULTI = ["Police arrested a man on Monday. The man was released later! He denies everything.",
              "The team won the cup. Fans celebrated in the streets."]
REFS_MULTI = [["A man was arrested by police on Monday.\nHe was later released and denies the charges.",
               "The man denies everything. He was released."],
              ["Fans celebrated in the streets after the team won the cup."]]


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


def test_rouge_lsum_is_rouge_score_summary_level_over_hand_split_sentences():
    """rougeLsum = rouge-score's rougeLsum on one sentence per line (split by hand here, independently of the
    code's splitter); rougeL stays rouge-score's sentence-level rougeL on the unsplit text."""
    split_hyps = ["Police arrested a man on Monday.\nThe man was released later!\nHe denies everything.",
                  "The team won the cup.\nFans celebrated in the streets."]
    split_refs = [["A man was arrested by police on Monday.\nHe was later released and denies the charges.",
                   "The man denies everything.\nHe was released."],
                  ["Fans celebrated in the streets after the team won the cup."]]
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL", "rougeLsum"], use_stemmer=True)
    expect = dict.fromkeys(["rouge1", "rouge2", "rougeL", "rougeLsum"], 0.0)
    for hyp, refs, split_hyp, split_ref in zip(HYPS_MULTI, REFS_MULTI, split_hyps, split_refs):
        for t in ("rouge1", "rouge2", "rougeL"):
            expect[t] += max(scorer.score(r, hyp)[t].fmeasure for r in refs) * 50
        expect["rougeLsum"] += max(scorer.score(r, split_hyp)["rougeLsum"].fmeasure for r in split_ref) * 50
    result = corpus_rouge(HYPS_MULTI, REFS_MULTI)
    for t, value in expect.items():
        assert getattr(result, t) == pytest.approx(value, abs=1e-9), t
    assert abs(result.rougeLsum - result.rougeL) > 1.0  # the two ROUGE-L variants really differ here
    assert result.metrics() == {t: getattr(result, t) for t in expect}
    assert "ROUGE-1/2/L/Lsum F1 " in str(result) and "summary-level rougeLsum" in str(result)
    assert result.scores().count("/") == 3


def test_rouge_lsum_of_one_sentence_texts_is_rouge_l():
    one = corpus_rouge(["the cat sat on the mat today"], [["a cat sat on a mat"]])
    assert one.rougeLsum == pytest.approx(one.rougeL, abs=1e-12) and one.rougeL > 0


def test_multi_reference_is_the_best_reference_per_type():
    """A hypothesis equal to the second (not the first) reference scores 100 everywhere; adding a worse reference
    never lowers a score."""
    refs = ["completely unrelated words here", "the model summarizes papers in one sentence"]
    exact = corpus_rouge([refs[1]], [refs])
    assert exact.metrics() == pytest.approx(dict.fromkeys(exact.metrics(), 100.0))
    hyp = ["the model writes one sentence"]
    alone = corpus_rouge(hyp, [refs[1:]])
    assert corpus_rouge(hyp, [refs]).metrics() == pytest.approx(alone.metrics())
    assert corpus_rouge(hyp, [refs[:1]]).rouge1 < alone.rouge1


def test_stemming_matters_and_is_reported():
    on, off = corpus_rouge(HYPS[:1], REFS[:1], True), corpus_rouge(HYPS[:1], REFS[:1], False)
    assert on.rouge1 > off.rouge1
    assert "stemming on" in str(on) and "stemming off" in str(off)


def test_rouge_input_errors():
    with pytest.raises(ValueError, match="reference"):
        corpus_rouge(["a"], [["a"], ["b"]])
    with pytest.raises(ValueError, match="at least one"):
        corpus_rouge(["a"], [[]])


def test_sentences_and_lead_split_after_punctuation_and_turns():
    assert sentences("One. Two!  Three?\n\nFour\n#Person2#: five") == ["One.", "Two!", "Three?", "Four",
                                                                         "#Person2#: five"]
    assert sentences("3.5 percent rose") == ["3.5 percent rose"]  # no whitespace after the dot: no split
    text = "First one. Second one! Third? Fourth.\n#Person2#: fifth"
    assert lead(text, 2) == "First one. Second one!"
    assert lead("#Person1#: Hi there\n#Person2#: Hello. Bye.", 2) == "#Person1#: Hi there #Person2#: Hello."
    assert lead("one sentence only", 3) == "one sentence only"


def test_perplexity_is_exp_of_mean_nll():
    assert perplexity(10 * math.log(50.0), 10) == pytest.approx(50.0)
    assert perplexity(1e6, 1) == math.inf and math.isnan(perplexity(0.0, 0))
