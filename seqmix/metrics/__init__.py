"""Evaluation metrics: BLEU (sacreBLEU), ROUGE (rouge-score), perplexity."""

from seqmix.metrics.bleu import BleuOptions, BleuResult, corpus_bleu
from seqmix.metrics.perplexity import perplexity
from seqmix.metrics.rouge import RougeOptions, RougeResult, corpus_rouge, lead

__all__ = ["BleuOptions", "BleuResult", "corpus_bleu", "RougeOptions", "RougeResult", "corpus_rouge", "lead", "perplexity"]
