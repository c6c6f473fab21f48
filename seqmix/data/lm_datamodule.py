"""Lightning data module for language modeling: lines -> vocabulary -> one token stream per split -> blocks."""

from __future__ import annotations

import logging
import os
from functools import partial
from pathlib import Path

import torch

from seqmix.data.datamodule import _pack, _unpack, save_atomic
from seqmix.data.lm_blocks import BREAK_MODES, BlockDataset, collate_blocks, make_blocks
from seqmix.data.token_budget_datamodule import TokenBudgetDataModule
from seqmix.data.tokenizer import Tokenizer, load_or_train_tokenizer, tokenizer_cache_key
from seqmix.errors import SeqmixError

log = logging.getLogger(__name__)

_TOKENIZER_DEFAULTS = {"kind": "word", "vocab_size": 300000, "lowercase": False, "min_frequency": 1}


class LanguageModelingDataModule(TokenBudgetDataModule):
    """``tokens_per_sample`` targets per sample (see ``seqmix.data.lm_blocks`` for ``break_mode`` and
    ``eval_context``); batches hold at most ``max_tokens`` padded input tokens. The vocabulary (word-level or BPE)
    is trained on the train split and cached with the encoded splits, like the translation data module."""

    def __init__(self, source, splits: dict, tokenizer: dict, tokens_per_sample: int = 512,
                 break_mode: str = "none", eval_context: int = 0, max_tokens: int = 4096,
                 max_tokens_valid: int | None = None, max_positions: int = 1024, num_workers: int = 0,
                 cache_dir: str = "~/.cache/seqmix", seed: int = 1):
        super().__init__()
        unknown = set(splits) - {"train", "valid", "test"}
        if unknown or not splits.get("train"):
            raise SeqmixError(f"task.data.splits={dict(splits)} must map 'train' (required), 'valid' and 'test' to "
                              f"the source's split names (null to disable); unknown keys: {sorted(unknown)}")
        tok = {**_TOKENIZER_DEFAULTS, **dict(tokenizer)}
        if set(tok) - set(_TOKENIZER_DEFAULTS):
            raise SeqmixError(f"unknown task.data.tokenizer keys {sorted(set(tok) - set(_TOKENIZER_DEFAULTS))}; "
                              f"allowed: {sorted(_TOKENIZER_DEFAULTS)}")
        if break_mode not in BREAK_MODES:
            raise SeqmixError(f"task.data.break_mode={break_mode!r} is unknown; choose one of {list(BREAK_MODES)}")
        if break_mode == "eos" and eval_context:
            raise SeqmixError("task.data.eval_context needs break_mode=none (with break_mode=eos sentences are "
                              "modelled independently, so there is no earlier context to add)")
        longest = tokens_per_sample + max(eval_context, 0)
        if longest > max_positions:
            raise SeqmixError(f"tokens_per_sample={tokens_per_sample} + eval_context={eval_context} exceeds the model's "
                              f"max_target_positions={max_positions}; lower them or raise model.max_target_positions")
        self.source = source
        self.splits = {k: v for k, v in dict(splits).items() if v is not None}
        self.tokenizer_cfg = tok
        self.tokens_per_sample, self.break_mode, self.eval_context = tokens_per_sample, break_mode, eval_context
        self.max_tokens, self.max_tokens_valid = max_tokens, max_tokens_valid
        self.num_workers, self.seed = num_workers, seed
        self.cache_dir = Path(os.path.expanduser(cache_dir))
        self.tokenizer: Tokenizer | None = None
        self.datasets: dict[str, BlockDataset] = {}

    def _fingerprint(self, split_name: str, corpus) -> str:
        own = getattr(self.source, "fingerprint", None)
        return own(split_name) if callable(own) else corpus.fingerprint()

    def _build(self) -> tuple[Tokenizer, dict[str, BlockDataset]]:
        corpora = {split: self.source.read(name) for split, name in self.splits.items()}
        train = corpora["train"]
        if len(train) == 0:
            raise SeqmixError(f"the train split {self.splits['train']!r} has no lines; check task.data.source")
        prints = {split: self._fingerprint(self.splits[split], c) for split, c in corpora.items()}
        cfg = self.tokenizer_cfg
        key_parts = {"task": "lm", "train": prints["train"]}
        tok = load_or_train_tokenizer(lambda: train.lines, cfg["vocab_size"], cfg["lowercase"], str(self.cache_dir),
                                      key_parts, min_frequency=cfg["min_frequency"], kind=cfg["kind"])
        key_dir = self.cache_dir / tokenizer_cache_key(cfg["vocab_size"], cfg["lowercase"], cfg["min_frequency"],
                                                      key_parts, cfg["kind"])
        datasets = {}
        for split, corpus in corpora.items():
            lines = self._encoded(tok, corpus.lines, key_dir / f"lm-{split}-{prints[split][:16]}.pt")
            context = 0 if split == "train" else self.eval_context
            datasets[split] = make_blocks(lines, tok.eos, tok.pad, self.tokens_per_sample, self.break_mode, context)
        return tok, datasets

    @staticmethod
    def _encoded(tok: Tokenizer, lines: list[str], path: Path) -> list[list[int]]:
        if path.is_file():
            try:
                ids = _unpack(torch.load(path, weights_only=True))
                if len(ids) == len(lines):
                    return ids
            except Exception as e:  # a truncated/foreign file: re-encode and overwrite it
                log.warning("ignoring unreadable encoding cache %s (%s)", path, e)
        ids = tok.encode_batch(lines)
        save_atomic(_pack(ids), path)
        return ids

    def prepare_data(self):
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.world_size > 1:
            self._build()

    def setup(self, stage=None):
        if self.tokenizer is not None:
            return
        self.tokenizer, self.datasets = self._build()
        for split, ds in self.datasets.items():
            log.info("%s: %d tokens in %d samples", split, ds.num_targets, len(ds))

    def batch_lengths(self, dataset: BlockDataset) -> tuple:
        return dataset.sizes, dataset.sizes

    def collate_fn(self):
        return partial(collate_blocks, pad=self.tokenizer.pad)
