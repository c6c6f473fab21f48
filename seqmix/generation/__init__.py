"""Decoding: batched beam search with incremental state (greedy = beam 1)."""

from seqmix.generation.beam_search import BeamSearch, Hypothesis, ban_repeated_ngrams

__all__ = ["BeamSearch", "Hypothesis", "ban_repeated_ngrams"]
