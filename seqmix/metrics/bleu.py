"""Corpus BLEU through sacreBLEU, always reported with its signature."""

from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU


@dataclass
class BleuResult:
    score: float
    signature: str
    text: str  # sacreBLEU's one-line summary (score, n-gram precisions, BP, lengths)

    def __str__(self) -> str:
        return f"{self.signature} = {self.text}"


@dataclass(frozen=True)
class BleuOptions:
    """sacreBLEU's settings (``corpus_bleu``)."""

    tokenize: str = "13a"
    lowercase: bool = False


def corpus_bleu(hypotheses: list[str], references: list[str], tokenize: str = "13a",
                lowercase: bool = False) -> BleuResult:
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    bleu = BLEU(tokenize=tokenize, lowercase=lowercase)
    result = bleu.corpus_score(hypotheses, [references])
    text = str(result).split(" = ", 1)[-1]
    return BleuResult(result.score, str(bleu.get_signature()), text)
