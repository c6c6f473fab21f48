"""What every task's data module shares: split and tokenizer settings, the tokenizer trained once on the train
split, and one memory-mapped token store per split, built by streaming the source through the tokenizer.

``prepare()`` is the whole preprocessing (``preprocess.py`` calls it; ``train.py`` through ``setup``/``prepare_data``
when a store is missing). Stores live under ``cache_dir/<tokenizer key>/<split>-<source fingerprint>.store``: the
tokenizer key covers the train split's content and every tokenizer setting, the fingerprint the split's content,
so a changed corpus or setting gets new stores and an old one is never reused. Concurrent processes (DDP ranks,
two preprocessing runs) build each store once; the others wait for it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import lightning
from torch.utils.data import DataLoader

from seqmix.data.batching import TokenBudgetBatchSampler
from seqmix.data.resumable_loader import ResumableLoader
from seqmix.data.token_store import StoreWriter, TokenStore, exclusive, open_or_build
from seqmix.data.tokenizer import Tokenizer, given_tokenizer, load_or_train_tokenizer, tokenizer_cache_key
from seqmix.errors import SeqmixError

log = logging.getLogger(__name__)

SPLIT_ROLES = ("train", "valid", "test")


class StoreDataModule(lightning.LightningDataModule):
    """Subclasses say which tokenizer settings they take (``TOKENIZER_DEFAULTS``), what the tokenizer learns from
    (``tokenizer_texts``), how a chunk of the source becomes store rows (``store_fields`` / ``write_chunk``), how
    a store becomes a dataset (``make_dataset``), how long an example is for the token budget (``batch_lengths``)
    and how a batch is collated (``collate_fn``). Loaders deal token-budget batches that the sampler itself shards
    across DDP ranks, so Lightning must not add its own distributed sampler."""

    TOKENIZER_DEFAULTS: dict = {}

    def __init__(self, source, splits: dict, tokenizer: dict, max_tokens: int = 4096,
                 max_tokens_valid: int | None = None, num_workers: int = 0, cache_dir: str = "~/.cache/seqmix",
                 seed: int = 1, chunk_size: int = 20_000, verify_store: bool = True):
        super().__init__()
        unknown = set(splits) - set(SPLIT_ROLES)
        if unknown or not splits.get("train"):
            raise SeqmixError(f"task.data.splits={dict(splits)} must map 'train' (required), 'valid' and 'test' to "
                              f"the source's split names (null to disable); unknown keys: {sorted(unknown)}")
        allowed = {**self.TOKENIZER_DEFAULTS, "file": None}
        tok = {**allowed, **dict(tokenizer)}
        if set(tok) - set(allowed):
            raise SeqmixError(f"unknown task.data.tokenizer keys {sorted(set(tok) - set(allowed))}; "
                              f"allowed: {sorted(allowed)}")
        if chunk_size < 1:
            raise SeqmixError(f"task.data.chunk_size={chunk_size} must be >= 1")
        self.source = source
        self.splits = {k: v for k, v in dict(splits).items() if v is not None}
        self.tokenizer_cfg = tok
        self.max_tokens, self.max_tokens_valid = max_tokens, max_tokens_valid
        self.num_workers, self.seed = num_workers, seed
        self.chunk_size, self.verify_store = int(chunk_size), bool(verify_store)
        self.cache_dir = Path(os.path.expanduser(cache_dir))
        self.tokenizer: Tokenizer | None = None
        self.datasets: dict = {}
        self.stores: dict[str, TokenStore] = {}
        self.built: dict[str, bool] = {}  # which stores this process wrote (the others existed or another built them)

    # ---- what subclasses vary ----------------------------------------------------------------------------------

    def key_parts(self) -> dict:
        """What the tokenizer (and so every store) depends on besides its settings and the train fingerprint."""
        raise NotImplementedError

    def tokenizer_texts(self, chunk) -> Iterator[str]:
        raise NotImplementedError

    def store_fields(self, writer: StoreWriter, split: str, tok: Tokenizer) -> None:
        raise NotImplementedError

    def write_chunk(self, writer: StoreWriter, split: str, tok: Tokenizer, chunk) -> None:
        raise NotImplementedError

    def make_dataset(self, split: str, store: TokenStore, tok: Tokenizer):
        raise NotImplementedError

    def describe(self, split: str, store: TokenStore, dataset) -> str:
        """One line for the log and ``preprocess.py``."""
        return f"{split}: {len(store):,} examples"

    # ---- preprocessing ----------------------------------------------------------------------------------------

    def _chunks(self, split: str):
        """The split in chunks; a source written with only ``read`` (e.g. a user's own) is read whole."""
        name = self.splits[split]
        if hasattr(self.source, "iter_chunks"):
            return self.source.iter_chunks(name, self.chunk_size)
        return iter([self.source.read(name)])

    def _tokenizer_texts(self) -> Iterator[str]:
        examples = 0
        for chunk in self._chunks("train"):
            examples += len(chunk)
            yield from self.tokenizer_texts(chunk)
        if examples == 0:
            raise SeqmixError(f"the train split {self.splits['train']!r} has no examples (no pairs or lines); check "
                              "task.data.source and task.data.splits.train")

    def fingerprint(self, split: str) -> str:
        """The source's own fingerprint of the split, or a hash of its text."""
        own = getattr(self.source, "fingerprint", None)
        return own(self.splits[split]) if callable(own) else self.source.read(self.splits[split]).fingerprint()

    def _tokenizer(self, train_print: str) -> tuple[Tokenizer, Path]:
        cfg = self.tokenizer_cfg
        parts = {**self.key_parts(), "train": train_print}
        if cfg["file"]:
            tok = given_tokenizer(cfg["file"])
            log.info("tokenizer from %s (%d symbols; the other task.data.tokenizer settings are not used)",
                     cfg["file"], tok.vocab_size)
            key_dir = self.cache_dir / tokenizer_cache_key(tok.vocab_size, False, 0,
                                                           {**parts, "given": tok.content_hash()}, "given")
            return tok, key_dir
        kind = cfg.get("kind", "bpe")
        key = tokenizer_cache_key(cfg["vocab_size"], cfg["lowercase"], cfg["min_frequency"], parts, kind)
        with exclusive(self.cache_dir / f"{key}.lock", "the tokenizer"):
            tok = load_or_train_tokenizer(self._tokenizer_texts, cfg["vocab_size"], cfg["lowercase"],
                                          str(self.cache_dir), parts, min_frequency=cfg["min_frequency"], kind=kind)
        return tok, self.cache_dir / key

    def _store(self, split: str, tok: Tokenizer, key_dir: Path, fingerprint: str) -> TokenStore:
        def build(writer: StoreWriter) -> dict:
            start = time.perf_counter()
            log.info("encoding the %s split into %s", split, writer.path)
            self.store_fields(writer, split, tok)
            for chunk in self._chunks(split):
                self.write_chunk(writer, split, tok, chunk)
            return {"split": split, "source_split": self.splits[split], "fingerprint": fingerprint,
                    "seconds": round(time.perf_counter() - start, 3)}

        path = key_dir / f"{split}-{fingerprint[:24]}.store"
        store, built = open_or_build(path, tok.content_hash(), tok.vocab_size, build, verify=self.verify_store)
        self.built[split] = built
        if built:
            log.info("wrote %s (%d examples, %.1f s)", path, len(store), store.meta.get("seconds", 0.0))
        return store

    def prepare(self) -> tuple[Tokenizer, dict[str, TokenStore]]:
        """Tokenizer and every split's store: loaded when present and valid, else built (once across processes)."""
        prints = {split: self.fingerprint(split) for split in self.splits}
        tok, key_dir = self._tokenizer(prints["train"])
        stores = {split: self._store(split, tok, key_dir, prints[split]) for split in self.splits}
        if len(stores["train"]) == 0:
            raise SeqmixError(f"the train split {self.splits['train']!r} has no examples (no pairs or lines); check "
                              "task.data.source and task.data.splits.train")
        return tok, stores

    def prepare_data(self):
        """With several processes, build what is missing once (Lightning runs this on one rank per node) before all
        set up; the stores' locks make concurrent building safe too."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.world_size > 1:
            self.prepare()

    def setup(self, stage=None):
        if self.tokenizer is not None:
            return
        tok, stores = self.prepare()
        datasets = {split: self.make_dataset(split, store, tok) for split, store in stores.items()}
        for split, ds in datasets.items():
            log.info(self.describe(split, stores[split], ds))
        self.tokenizer, self.stores, self.datasets = tok, stores, datasets

    def summary(self) -> list[str]:
        """One line per split (after ``setup``): what ``preprocess.py`` prints."""
        return [f"{self.describe(split, self.stores[split], ds)}\n  {'built' if self.built.get(split) else 'found'}: "
                f"{self.stores[split].path}" for split, ds in self.datasets.items()]

    # ---- token-budget loaders ----------------------------------------------------------------------------------

    max_sentences: int | None = None

    def batch_lengths(self, dataset) -> tuple:
        """(source lengths, target lengths) of every example, for the padded-token budget."""
        raise NotImplementedError

    def collate_fn(self):
        raise NotImplementedError

    def _rank_world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        return (0, 1) if trainer is None else (trainer.global_rank, trainer.world_size)

    def dataloader(self, split: str, shuffle: bool = False) -> DataLoader:
        """Token-budget loader; ``shuffle=True`` means training (shuffled), otherwise evaluation (fixed order).

        Under DDP every rank gets the same number of batches (a rank with fewer repeats earlier batches whole),
        so per-step collectives never hang; evaluation drops the repeats by their example ids."""
        if self.tokenizer is None:
            self.setup()
        if split not in self.datasets:
            raise SeqmixError(f"no {split!r} split is configured (have {sorted(self.datasets)}); set "
                              f"task.data.splits.{split}")
        ds = self.datasets[split]
        rank, world = self._rank_world()
        connector = getattr(getattr(self, "trainer", None), "_accelerator_connector", None)
        if world > 1 and getattr(connector, "use_distributed_sampler", False):
            raise SeqmixError(f"{type(self).__name__} shards its token-budget batches across ranks itself; create "
                              "the Trainer with use_distributed_sampler=False (trainer.use_distributed_sampler=false)")
        budget = self.max_tokens if shuffle else (self.max_tokens_valid or self.max_tokens)
        sampler = TokenBudgetBatchSampler(*self.batch_lengths(ds), budget, self.max_sentences, shuffle=shuffle,
                                          seed=self.seed, rank=rank, world_size=world)
        options = {"num_workers": self.num_workers, "collate_fn": self.collate_fn(),
                   "persistent_workers": self.num_workers > 0}
        if shuffle:
            return ResumableLoader(ds, sampler, self._trained_batches, self._current_epoch, **options)
        return DataLoader(ds, batch_sampler=sampler, **options)

    def _trained_batches(self) -> int:
        """Batches of the current epoch the training loop has finished (for a checkpoint's loader state)."""
        trainer = getattr(self, "trainer", None)
        return 0 if trainer is None else trainer.fit_loop.epoch_loop.batch_progress.current.processed

    def _current_epoch(self) -> int | None:
        trainer = getattr(self, "trainer", None)
        return None if trainer is None else trainer.current_epoch

    def train_dataloader(self):
        return self.dataloader("train", shuffle=True)

    def val_dataloader(self):
        """An empty list (no validation) when no valid split is configured."""
        if self.tokenizer is None:
            self.setup()
        return self.dataloader("valid") if "valid" in self.datasets else []

    def test_dataloader(self):
        return self.dataloader("test")


def count_values(store: TokenStore, field: str) -> int:
    return int(store.fields[field]["values"]) - int(store.fields[field]["head"])
