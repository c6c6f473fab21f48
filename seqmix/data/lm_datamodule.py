"""Lightning data module for language modeling: lines -> vocabulary -> one token stream per split -> blocks."""

from __future__ import annotations

from functools import partial

import numpy as np

from seqmix.data.lm_blocks import BREAK_MODES, BlockDataset, blocks_over, collate_blocks
from seqmix.data.store_datamodule import StoreDataModule, count_values
from seqmix.data.token_store import StoreWriter, TokenStore
from seqmix.data.tokenizer import Tokenizer
from seqmix.errors import SeqmixError


class LanguageModelingDataModule(StoreDataModule):
    """``tokens_per_sample`` targets per sample (see ``seqmix.data.lm_blocks`` for ``break_mode`` and
    ``eval_context``); batches hold at most ``max_tokens`` padded input tokens. The vocabulary (word-level or BPE)
    is trained on the train split. A split's store holds its stream itself (``</s>``, then every line followed by
    ``</s>``), so samples are slices of the memory map, computed from the line offsets when the split is read."""

    TOKENIZER_DEFAULTS = {"kind": "word", "vocab_size": 300000, "lowercase": False, "min_frequency": 1}

    def __init__(self, source, splits: dict, tokenizer: dict, tokens_per_sample: int = 512,
                 break_mode: str = "none", eval_context: int = 0, max_tokens: int = 4096,
                 max_tokens_valid: int | None = None, max_positions: int = 1024, num_workers: int = 0,
                 cache_dir: str = "~/.cache/seqmix", seed: int = 1, chunk_size: int = 20_000, verify_store: bool = True):
        super().__init__(source, splits, tokenizer, max_tokens, max_tokens_valid, num_workers, cache_dir, seed,
                         chunk_size, verify_store)
        if break_mode not in BREAK_MODES:
            raise SeqmixError(f"task.data.break_mode={break_mode!r} is unknown; choose one of {list(BREAK_MODES)}")
        if break_mode == "eos" and eval_context:
            raise SeqmixError("task.data.eval_context needs break_mode=none (with break_mode=eos sentences are "
                              "modelled independently, so there is no earlier context to add)")
        longest = tokens_per_sample + max(eval_context, 0)
        if longest > max_positions:
            raise SeqmixError(f"tokens_per_sample={tokens_per_sample} + eval_context={eval_context} exceeds the model's "
                              f"max_target_positions={max_positions}; lower them or raise model.max_target_positions")
        self.tokens_per_sample, self.break_mode, self.eval_context = tokens_per_sample, break_mode, eval_context

    def key_parts(self) -> dict:
        return {"task": "lm"}

    def tokenizer_texts(self, chunk):
        return iter(chunk.lines)

    def store_fields(self, writer: StoreWriter, split: str, tok: Tokenizer) -> None:
        writer.add_field("stream", head=(tok.eos,))

    def write_chunk(self, writer: StoreWriter, split: str, tok: Tokenizer, chunk) -> None:
        flat, sizes = tok.encode_flat(chunk.lines)
        rows = sizes + 1
        stream = np.full(int(rows.sum()), tok.eos, dtype=np.int64)
        is_token = np.ones(len(stream), dtype=bool)
        is_token[np.cumsum(rows) - 1] = False  # each line's eos
        stream[is_token] = flat
        writer.append("stream", stream, rows)

    def make_dataset(self, split: str, store: TokenStore, tok: Tokenizer) -> BlockDataset:
        rows = store.tokens("stream")
        context = 0 if split == "train" else self.eval_context
        return blocks_over(rows.flat, rows.offsets, tok.pad, self.tokens_per_sample, self.break_mode, context)

    def describe(self, split: str, store: TokenStore, dataset: BlockDataset) -> str:
        return (f"{split}: {len(store):,} lines, {count_values(store, 'stream'):,} tokens incl. </s> in "
                f"{len(dataset):,} samples")

    def batch_lengths(self, dataset: BlockDataset) -> tuple:
        return dataset.sizes, dataset.sizes

    def collate_fn(self):
        return partial(collate_blocks, pad=self.tokenizer.pad)
