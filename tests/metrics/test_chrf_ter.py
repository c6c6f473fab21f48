"""chrF and TER beside BLEU (issue 36): values checked against hand computations from the metrics' definitions,
the task's report carries them (printed lines and logged names), and generate.py prints them for translation and
refuses them elsewhere."""

from __future__ import annotations

import pytest

from seqmix.metrics import corpus_metric
from seqmix.metrics.bleu import BleuOptions


def test_ter_is_edits_over_reference_words():
    # one substitution (the -> a) over 6 reference words; one deletion over 2 (TER counts per corpus)
    assert corpus_metric("ter", ["the cat sat on the mat"], ["the cat sat on a mat"]).score == pytest.approx(100 / 6)
    assert corpus_metric("ter", ["the cat sat on the mat", "dog"], ["the cat sat on a mat", "the dog"]).score == \
        pytest.approx(100 * 2 / 8)


def chrf_by_hand(hyp: str, ref: str, n: int = 6, beta: float = 2.0) -> float:
    """chrF (Popović 2015) as sacreBLEU computes it for one sentence: character n-grams of the text without spaces,
    precision and recall averaged over n = 1..6, then F-beta."""
    from collections import Counter

    h, r = hyp.replace(" ", ""), ref.replace(" ", "")
    precisions, recalls = [], []
    for k in range(1, n + 1):
        hc, rc = Counter(h[i:i + k] for i in range(len(h) - k + 1)), Counter(r[i:i + k] for i in range(len(r) - k + 1))
        match = sum((hc & rc).values())
        precisions.append(match / max(sum(hc.values()), 1) if hc else 0.0)
        recalls.append(match / max(sum(rc.values()), 1) if rc else 0.0)
    p, r_ = sum(precisions) / n, sum(recalls) / n
    return 100 * (1 + beta ** 2) * p * r_ / (beta ** 2 * p + r_)


def test_chrf_equals_the_definition_on_one_sentence():
    hyp, ref = "the cats sat on the mat", "the cat sat on a mat"
    assert corpus_metric("chrf", [hyp], [ref]).score == pytest.approx(chrf_by_hand(hyp, ref), abs=1e-6)
    assert corpus_metric("chrf", [ref], [ref]).score == pytest.approx(100.0)
    plus = corpus_metric("chrf++", [hyp], [ref])
    assert plus.name == "chrf_pp" and plus.line.startswith("chrF2++: nrefs:1") and plus.score < 100


def test_lowercase_makes_case_free_scores():
    assert corpus_metric("chrf", ["The Cat"], ["the cat"], lowercase=True).score == pytest.approx(100.0)
    assert corpus_metric("ter", ["The Cat"], ["the cat"], lowercase=True).score == pytest.approx(0.0)
    assert corpus_metric("ter", ["The Cat"], ["the cat"]).score == pytest.approx(100.0)


def test_the_translation_report_carries_them():
    from types import SimpleNamespace

    from seqmix.tasks.translation import TranslationTask

    task = SimpleNamespace(bleu=BleuOptions(), extra_metrics=("chrf", "ter"))
    report = TranslationTask.score(task, ["the cat sat on the mat"], [["the cat sat on a mat"]], ["x"])
    assert report.metrics["ter"] == pytest.approx(100 / 6) and 0 < report.metrics["chrf"] < 100
    assert [d.split(":")[0] for d in report.details] == ["sacreBLEU", "chrF2", "TER"]
