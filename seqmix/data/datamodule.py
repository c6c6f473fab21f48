"""Lightning data module: source -> tokenizer -> encoded, length-filtered splits -> token-budget loaders."""

from __future__ import annotations

import logging
import os
import tempfile
from functools import partial
from itertools import chain
from pathlib import Path

import torch

from seqmix.data.dataset import PairDataset, collate_pairs, filter_by_length
from seqmix.data.sources import ParallelCorpus
from seqmix.data.token_budget_datamodule import TokenBudgetDataModule
from seqmix.data.tokenizer import Tokenizer, load_or_train_tokenizer, tokenizer_cache_key
from seqmix.errors import SeqmixError

log = logging.getLogger(__name__)

_TOKENIZER_DEFAULTS = {"vocab_size": 8000, "lowercase": False, "min_frequency": 2, "joint": True}


def _pack(seqs: list[list[int]]) -> dict:
    """Flat tensor + lengths: loads ~50x faster than pickled lists of lists."""
    flat = torch.tensor([i for s in seqs for i in s], dtype=torch.int32)
    return {"flat": flat, "lengths": torch.tensor([len(s) for s in seqs], dtype=torch.int64)}


def _unpack(packed: dict) -> list[list[int]]:
    flat, out, start = packed["flat"].tolist(), [], 0
    for n in packed["lengths"].tolist():
        out.append(flat[start : start + n])
        start += n
    return out


def save_atomic(obj, path: Path) -> None:
    """torch.save via a temp file + rename: a crash or a concurrent rank never leaves a half-written cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


class TranslationDataModule(TokenBudgetDataModule):
    """Reads every configured split once, shares one joint BPE tokenizer, and caches encodings on disk."""

    def __init__(self, source, src_lang: str, tgt_lang: str, splits: dict, tokenizer: dict,
                 max_tokens: int = 4096, max_sentences: int | None = None, max_tokens_valid: int | None = None,
                 max_source_positions: int = 1024, max_target_positions: int = 1024,
                 num_workers: int = 0, cache_dir: str = "~/.cache/seqmix", seed: int = 1):
        super().__init__()
        unknown = set(splits) - {"train", "valid", "test"}
        if unknown or not splits.get("train"):
            raise SeqmixError(
                f"task.data.splits={dict(splits)} must map 'train' (required), 'valid' and 'test' to the "
                f"source's split names (null to disable); unknown keys: {sorted(unknown)}"
            )
        tok = {**_TOKENIZER_DEFAULTS, **dict(tokenizer)}
        if set(tok) - set(_TOKENIZER_DEFAULTS):
            raise SeqmixError(f"unknown task.data.tokenizer keys {sorted(set(tok) - set(_TOKENIZER_DEFAULTS))}; "
                              f"allowed: {sorted(_TOKENIZER_DEFAULTS)}")
        if not tok["joint"]:
            raise SeqmixError("only a joint source+target vocabulary is supported; set task.data.tokenizer.joint=true")
        self.source, self.src_lang, self.tgt_lang = source, src_lang, tgt_lang
        self.splits = {k: v for k, v in dict(splits).items() if v is not None}
        self.tokenizer_cfg = tok
        self.max_tokens, self.max_sentences, self.max_tokens_valid = max_tokens, max_sentences, max_tokens_valid
        self.max_source_positions, self.max_target_positions = max_source_positions, max_target_positions
        self.num_workers, self.seed = num_workers, seed
        self.cache_dir = Path(os.path.expanduser(cache_dir))
        self.tokenizer: Tokenizer | None = None
        self.datasets: dict[str, PairDataset] = {}
        self.num_skipped: dict[str, int] = {}

    # ---- building -------------------------------------------------------------------------------------------

    def _fingerprint(self, split_name: str, corpus: ParallelCorpus) -> str:
        own = getattr(self.source, "fingerprint", None)
        return own(split_name) if callable(own) else corpus.fingerprint()

    def _build(self):
        """Everything setup() needs, without touching self: usable from prepare_data() too."""
        corpora = {split: self.source.read(name) for split, name in self.splits.items()}
        train = corpora["train"]
        if len(train) == 0:
            raise SeqmixError(f"the train split {self.splits['train']!r} has no pairs; check task.data.source.path "
                              "and task.data.splits.train")
        prints = {split: self._fingerprint(self.splits[split], c) for split, c in corpora.items()}
        cfg = self.tokenizer_cfg
        key_parts = {"src_lang": self.src_lang, "tgt_lang": self.tgt_lang, "joint": True, "train": prints["train"]}
        tok = load_or_train_tokenizer(lambda: chain(train.src, train.tgt), cfg["vocab_size"], cfg["lowercase"],
                                      str(self.cache_dir), key_parts, min_frequency=cfg["min_frequency"])
        key_dir = self.cache_dir / tokenizer_cache_key(cfg["vocab_size"], cfg["lowercase"], cfg["min_frequency"],
                                                      key_parts)
        datasets, skipped = {}, {}
        for split, corpus in corpora.items():
            src, tgt = self._encoded(tok, corpus, key_dir / f"{split}-{prints[split][:16]}.pt")
            src = self.prepare_sources(src)
            full = PairDataset(src, tgt, corpus.src, corpus.tgt, eos=tok.eos)
            keep, skipped[split] = filter_by_length(full.src_sizes, full.tgt_sizes,
                                                    self.max_source_positions, self.max_target_positions)
            keep = keep.tolist()
            refs = corpus.reference_sets()
            datasets[split] = PairDataset([src[i] for i in keep], [tgt[i] for i in keep],
                                          [corpus.src[i] for i in keep], [corpus.tgt[i] for i in keep], eos=tok.eos,
                                          references=[refs[i] for i in keep])
        if len(datasets["train"]) == 0:
            raise SeqmixError(
                f"all {len(train)} training pairs are longer than max_source_positions="
                f"{self.max_source_positions} / max_target_positions={self.max_target_positions}; raise them"
            )
        return tok, datasets, skipped

    def prepare_sources(self, src: list[list[int]]) -> list[list[int]]:
        """Hook for subclasses (summarization truncates long documents); translation keeps sources whole."""
        return src

    @staticmethod
    def _encoded(tok: Tokenizer, corpus: ParallelCorpus, path: Path) -> tuple[list, list]:
        """Encode a split, or load it from ``path`` (keyed by tokenizer + split content, so never stale)."""
        if path.is_file():
            try:
                data = torch.load(path, weights_only=True)
                src, tgt = _unpack(data["src"]), _unpack(data["tgt"])
                if len(src) == len(tgt) == len(corpus):
                    return src, tgt
            except Exception as e:  # a truncated/foreign file: re-encode and overwrite it
                log.warning("ignoring unreadable encoding cache %s (%s)", path, e)
        src, tgt = tok.encode_batch(corpus.src), tok.encode_batch(corpus.tgt)
        save_atomic({"src": _pack(src), "tgt": _pack(tgt)}, path)
        return src, tgt

    def prepare_data(self):
        """With several processes, fill the caches once (Lightning runs this on one rank) before all set up."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.world_size > 1:
            self._build()

    def setup(self, stage=None):
        if self.tokenizer is not None:
            return
        tok, datasets, skipped = self._build()
        for split, n in skipped.items():
            if n:
                level = logging.INFO if split == "train" else logging.WARNING
                log.log(level, "%s: skipped %d of %d pairs longer than max_source_positions=%d / "
                        "max_target_positions=%d", split, n, n + len(datasets[split]),
                        self.max_source_positions, self.max_target_positions)
        self.tokenizer, self.datasets, self.num_skipped = tok, datasets, skipped

    # ---- loading --------------------------------------------------------------------------------------------

    def batch_lengths(self, dataset: PairDataset) -> tuple:
        return dataset.src_sizes, dataset.tgt_sizes

    def collate_fn(self):
        tok = self.tokenizer
        return partial(collate_pairs, pad=tok.pad, bos=tok.bos, eos=tok.eos)

    def references(self, split: str) -> list[str]:
        """Normalized raw targets of the kept pairs, indexed like the dataset (batch ``id`` -> reference)."""
        if self.tokenizer is None:
            self.setup()
        return [self.tokenizer.normalize_reference(t) for t in self.datasets[split].tgt_texts]

    def reference_sets(self, split: str) -> list[list[str]]:
        """Every normalized reference of each kept example (one for translation data), indexed like the dataset."""
        if self.tokenizer is None:
            self.setup()
        norm = self.tokenizer.normalize_reference
        return [[norm(r) for r in refs] for refs in self.datasets[split].references]
