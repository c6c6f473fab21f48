"""Evaluation metrics: BLEU, chrF and TER (sacreBLEU), ROUGE (rouge-score), perplexity."""

from seqmix.metrics.bleu import PAPER_BLEU_KINDS, BleuOptions, BleuResult, corpus_bleu, paper_bleu
from seqmix.metrics.chrf_ter import METRICS, corpus_metric
from seqmix.metrics.perplexity import perplexity
from seqmix.metrics.rouge import RougeOptions, RougeResult, corpus_rouge, lead

__all__ = ["PAPER_BLEU_KINDS", "BleuOptions", "BleuResult", "corpus_bleu", "paper_bleu", "RougeOptions", "RougeResult",
           "corpus_rouge", "lead", "perplexity", "METRICS", "corpus_metric"]
