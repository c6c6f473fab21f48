"""Decoding: batched beam search with incremental state (greedy = beam 1), iterative NAT decoding, their
settings (``options``) and the dataset loop both run in (``decode``)."""

from seqmix.generation.beam_search import BeamSearch, Hypothesis, ban_repeated_ngrams
from seqmix.generation.options import BeamOptions, NATOptions

__all__ = ["BeamSearch", "BeamOptions", "Hypothesis", "NATOptions", "ban_repeated_ngrams"]
