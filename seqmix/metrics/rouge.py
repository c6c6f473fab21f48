"""ROUGE-1/2/L F1 through Google's ``rouge-score`` (Porter stemming on), and the lead-N extractive baseline.

Multi-reference: each example scores the best F1 over its references, per ROUGE type (``score_multi``); the
corpus score is the mean over examples, ×100. ROUGE-L is rouge-score's sentence-level ``rougeL`` over the
whole text (no summary-level ``rougeLsum`` sentence splitting). rouge-score lowercases and keeps only
[a-z0-9] tokens, so casing and punctuation do not matter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rouge_score import rouge_scorer

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


@dataclass
class RougeResult:
    rouge1: float
    rouge2: float
    rougeL: float
    n: int
    refs_per_example: float
    stemming: bool

    def scores(self) -> str:
        return f"{self.rouge1:.2f}/{self.rouge2:.2f}/{self.rougeL:.2f}"

    def __str__(self) -> str:
        return (f"ROUGE-1/2/L F1 {self.scores()} (rouge-score, stemming {'on' if self.stemming else 'off'}, "
                f"{self.n} examples, {self.refs_per_example:.2f} references each)")


def corpus_rouge(hypotheses: list[str], references: list[list[str]], stemming: bool = True) -> RougeResult:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} reference sets")
    if any(not refs for refs in references):
        raise ValueError("every example needs at least one reference")
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=stemming)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for hyp, refs in zip(hypotheses, references):
        scores = scorer.score_multi(refs, hyp)
        for t in ROUGE_TYPES:
            totals[t] += scores[t].fmeasure
    n = max(len(hypotheses), 1)
    return RougeResult(*(100.0 * totals[t] / n for t in ROUGE_TYPES), n=len(hypotheses),
                       refs_per_example=sum(map(len, references)) / n, stemming=stemming)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def lead(text: str, n: int) -> str:
    """The first ``n`` sentences (split after . ! ? and at line breaks, e.g. dialogue turns)."""
    sentences = [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]
    return " ".join(sentences[:n])
