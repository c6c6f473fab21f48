"""chrF and TER beside BLEU (sacreBLEU's own implementations, with their signatures): character n-gram F-score
(chrF2; ``chrf++`` adds word bigrams, Popović 2017) and translation edit rate (lower is better). ``generate.py``
prints those its ``metrics=`` names; validation during training computes BLEU only (TER is slow on long splits)."""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import CHRF, TER

METRICS = ("chrf", "chrf++", "ter")


@dataclass
class MetricResult:
    name: str  # the logged name: chrf, chrf_pp, ter
    score: float
    line: str  # sacreBLEU's signature and score, as printed

    def __str__(self) -> str:
        return self.line


def _scorer(name: str, lowercase: bool):
    if name == "chrf":
        return CHRF(lowercase=lowercase)
    if name == "chrf++":
        return CHRF(word_order=2, lowercase=lowercase)
    if name == "ter":
        return TER(case_sensitive=not lowercase)
    raise ValueError(f"unknown metric {name!r}; choose from {list(METRICS)}")


def corpus_metric(name: str, hypotheses: list[str], references: list[str], lowercase: bool = False) -> MetricResult:
    """One of ``METRICS`` over the corpus, against one reference per hypothesis."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    scorer = _scorer(name, lowercase)
    result = scorer.corpus_score(hypotheses, [references])
    label, _, value = str(result).partition(" = ")
    line = f"{label}: {scorer.get_signature()} = {value}"
    return MetricResult(name.replace("++", "_pp"), float(result.score), line)
