"""Evaluation metrics: BLEU (sacreBLEU), ROUGE (rouge-score), perplexity."""

from seqmix.metrics.bleu import BleuResult, corpus_bleu
from seqmix.metrics.perplexity import perplexity
from seqmix.metrics.rouge import RougeResult, corpus_rouge, lead

__all__ = ["BleuResult", "corpus_bleu", "RougeResult", "corpus_rouge", "lead", "perplexity"]
