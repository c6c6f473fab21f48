"""Data pipeline: parallel text sources, joint BPE tokenizer, token-budget batching, Lightning data module."""

from seqmix.data.batching import TokenBudgetBatchSampler
from seqmix.data.datamodule import TranslationDataModule
from seqmix.data.dataset import PairDataset, collate_pairs, filter_by_length
from seqmix.data.sources import HFParallelSource, LocalParallelSource, ParallelCorpus, ToyReverseSource
from seqmix.data.tokenizer import (
    SPECIALS,
    Tokenizer,
    load_or_train_tokenizer,
    tokenizer_cache_key,
    train_tokenizer,
)

__all__ = [
    "SPECIALS",
    "HFParallelSource",
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
