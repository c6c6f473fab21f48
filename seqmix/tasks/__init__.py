"""LightningModules: loss, metrics, optimizers and decoding for each task family."""

from seqmix.tasks.base import Report, SeqmixTask
from seqmix.tasks.language_modeling import LanguageModelingTask
from seqmix.tasks.summarization import SummarizationTask
from seqmix.tasks.translation import TranslationTask

__all__ = ["Report", "SeqmixTask", "TranslationTask", "LanguageModelingTask", "SummarizationTask"]
