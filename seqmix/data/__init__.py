"""Data pipeline: text sources, tokenizers (joint BPE or words), token-budget batching, Lightning data modules."""

from seqmix.data.batching import TokenBudgetBatchSampler
from seqmix.data.dataset import PairDataset, collate_pairs, filter_by_length
from seqmix.data.lm_blocks import BlockDataset, collate_blocks, make_blocks
from seqmix.data.lm_datamodule import LanguageModelingDataModule
from seqmix.data.sources import HFParallelSource, LocalParallelSource, ParallelCorpus, ToyReverseSource
from seqmix.data.summary_sources import JsonlSummarySource
from seqmix.data.text_sources import HFTextSource, LocalTextSource, TextCorpus
from seqmix.data.tokenizer import (
    SPECIALS,
    Tokenizer,
    load_or_train_tokenizer,
    tokenizer_cache_key,
    train_tokenizer,
)
from seqmix.data.translation_datamodule import TranslationDataModule

__all__ = [
    "SPECIALS",
    "BlockDataset",
    "HFParallelSource",
    "HFTextSource",
    "JsonlSummarySource",
    "LanguageModelingDataModule",
    "LocalTextSource",
    "TextCorpus",
    "collate_blocks",
    "make_blocks",
    "LocalParallelSource",
    "PairDataset",
    "ParallelCorpus",
    "TokenBudgetBatchSampler",
    "Tokenizer",
    "ToyReverseSource",
    "TranslationDataModule",
    "collate_pairs",
    "filter_by_length",
    "load_or_train_tokenizer",
    "tokenizer_cache_key",
    "train_tokenizer",
]
