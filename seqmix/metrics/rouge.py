"""ROUGE-1/2/L/Lsum F1 through Google's ``rouge-score`` (Porter stemming on), and the lead-N extractive baseline.

Two ROUGE-L variants are reported, named as rouge-score names them:

- ``rougeL``: sentence-level, one longest common subsequence over the whole text.
- ``rougeLsum``: summary-level (Lin 2004 §3.2, what ROUGE-1.5.5 / files2rouge report as ROUGE-L for
  multi-sentence summaries and what the CNN-DM papers quote): the union LCS of every reference sentence against
  all hypothesis sentences. Sentences are split here (``sentences``: after . ! ? followed by whitespace, and at
  line breaks) and joined with newlines, which is how rouge-score expects them; rouge-score's own
  ``split_summaries`` needs NLTK's punkt data, which is not assumed to be installed. Abbreviations such as "Mr."
  therefore end a sentence.

Multi-reference: each example scores the best F1 over its references, separately per ROUGE type (rouge-score's
``score_multi``); the corpus score is the mean over examples, ×100. Other conventions exist: the SciTLDR
script (Cachola et al. 2020, ``cal-rouge.py`` "multi-max") picks the one reference with the best ROUGE-1 F1 and
reports ROUGE-2/L against that same reference (so its ROUGE-2/L can be lower than ours), and the DialogSum
authors pool n-gram counts over the references with py-rouge. With one reference they all agree.
rouge-score lowercases and keeps only [a-z0-9] tokens, so casing and punctuation do not matter.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rouge_score import rouge_scorer

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


@dataclass
class RougeResult:
    rouge1: float
    rouge2: float
    rougeL: float  # sentence-level (whole text as one sequence)
    rougeLsum: float  # summary-level (sentences split, union LCS)
    n: int
    refs_per_example: float
    stemming: bool

    LABEL = "ROUGE-1/2/L/Lsum"

    def scores(self) -> str:
        return f"{self.rouge1:.2f}/{self.rouge2:.2f}/{self.rougeL:.2f}/{self.rougeLsum:.2f}"

    def metrics(self) -> dict[str, float]:
        return {t: getattr(self, t) for t in ROUGE_TYPES}

    def __str__(self) -> str:
        return (f"{self.LABEL} F1 {self.scores()} (rouge-score, stemming {'on' if self.stemming else 'off'}, "
                f"{self.n} examples, {self.refs_per_example:.2f} references each; L = sentence-level rougeL, "
                f"Lsum = summary-level rougeLsum)")


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


@dataclass(frozen=True)
class RougeOptions:
    stemming: bool = True  # Porter stemming in rouge-score
    lead: int = 3  # sentences of the lead-N baseline


def sentences(text: str) -> list[str]:
    """Split after . ! ? (followed by whitespace) and at line breaks (e.g. dialogue turns); empty pieces dropped."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def _one_per_line(text: str) -> str:
    """The form rougeLsum reads (one sentence per line). rouge1/2/rougeL are unaffected: newlines are not tokens."""
    return "\n".join(sentences(text))


def corpus_rouge(hypotheses: list[str], references: list[list[str]], stemming: bool = True) -> RougeResult:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} reference sets")
    if any(not refs for refs in references):
        raise ValueError("every example needs at least one reference")
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=stemming)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for hyp, refs in zip(hypotheses, references):
        scores = scorer.score_multi([_one_per_line(r) for r in refs], _one_per_line(hyp))
        for t in ROUGE_TYPES:
            totals[t] += scores[t].fmeasure
    n = max(len(hypotheses), 1)
    return RougeResult(*(100.0 * totals[t] / n for t in ROUGE_TYPES), n=len(hypotheses),
                       refs_per_example=sum(map(len, references)) / n, stemming=stemming)


def lead(text: str, n: int) -> str:
    """The first ``n`` sentences (split after . ! ? and at line breaks, e.g. dialogue turns)."""
    return " ".join(sentences(text)[:n])
