"""seqmix from Python: ``seqmix.load(checkpoint)`` gives a :class:`Model` that translates, summarizes, scores and
samples with the same functions ``generate.py`` runs."""

from seqmix.api.model import Model, load

__all__ = ["Model", "load"]
