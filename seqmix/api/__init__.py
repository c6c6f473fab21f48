"""seqmix from Python: ``seqmix.load(checkpoint)`` gives a :class:`Model` that translates, summarizes, scores and
samples with the same functions ``generate.py`` runs; hypotheses with scores are :class:`TextHypothesis`."""

from seqmix.api.model import Model, load, load_fairseq
from seqmix.generation.decode import TextHypothesis

__all__ = ["Model", "TextHypothesis", "load", "load_fairseq"]
