"""Evaluation metrics (BLEU via sacreBLEU; ROUGE and perplexity join with their tasks)."""

from seqmix.metrics.bleu import BleuResult, corpus_bleu

__all__ = ["BleuResult", "corpus_bleu"]
