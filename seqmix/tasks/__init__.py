"""LightningModules: loss, metrics, optimizers and decoding for each task family."""

from seqmix.tasks.translation import TranslationTask

__all__ = ["TranslationTask"]
