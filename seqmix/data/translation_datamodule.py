"""Lightning data module for translation: parallel text -> joint tokenizer -> token stores -> token-budget loaders."""

from __future__ import annotations

import json
import logging
from functools import partial

from seqmix.data.dataset import PairDataset, collate_pairs, filter_by_length
from seqmix.data.store_datamodule import StoreDataModule, count_values
from seqmix.data.token_store import StoreWriter, TokenStore
from seqmix.data.tokenizer import Tokenizer
from seqmix.errors import SeqmixError

log = logging.getLogger(__name__)


class TranslationDataModule(StoreDataModule):
    """Pairs of every configured split; one joint BPE tokenizer; scored splits (valid, test) also keep their raw
    text and references. Pairs longer than the model's positions are skipped (and counted) when a split is read,
    so changing the model's positions never rebuilds a store. Skipping more than ``max_skipped_fraction`` of a
    split is an error (positions set below the data, or a misaligned corpus), not a run on what is left or a score
    of part of a split.

    ``truncate_source`` (document -> summary pairs): keep the first N subword tokens of every source, before its
    eos (400 for CNN-DM, as See et al. 2017 and Wu et al. 2019); null keeps sources whole and skips too-long pairs.
    Truncation happens when rows are read, so the store keeps whole documents."""

    TOKENIZER_DEFAULTS = {"vocab_size": 8000, "lowercase": False, "min_frequency": 2, "joint": True}

    def __init__(self, source, src_lang: str, tgt_lang: str, splits: dict, tokenizer: dict,
                 max_tokens: int = 4096, max_sentences: int | None = None, max_tokens_valid: int | None = None,
                 max_source_positions: int = 1024, max_target_positions: int = 1024,
                 num_workers: int = 0, cache_dir: str = "~/.cache/seqmix", seed: int = 1, chunk_size: int = 20_000,
                 verify_store: bool = True, max_skipped_fraction: float = 0.01,
                 truncate_source: int | None = None):
        super().__init__(source, splits, tokenizer, max_tokens, max_tokens_valid, num_workers, cache_dir, seed,
                         chunk_size, verify_store)
        if not self.tokenizer_cfg["joint"]:
            raise SeqmixError("only a joint source+target vocabulary is supported; set task.data.tokenizer.joint=true")
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.max_sentences = max_sentences
        self.max_source_positions, self.max_target_positions = max_source_positions, max_target_positions
        self.num_skipped: dict[str, int] = {}
        if not 0.0 <= max_skipped_fraction <= 1.0:
            raise SeqmixError(f"task.data.max_skipped_fraction={max_skipped_fraction} must be between 0 and 1")
        self.max_skipped_fraction = max_skipped_fraction
        if truncate_source is not None and not 1 <= truncate_source < max_source_positions:
            raise SeqmixError(f"task.data.truncate_source={truncate_source} must be between 1 and "
                              f"max_source_positions - 1 = {max_source_positions - 1} (one position is the eos)")
        self.truncate_source = truncate_source

    # ---- the store ----------------------------------------------------------------------------------------------

    def key_parts(self) -> dict:
        return {"src_lang": self.src_lang, "tgt_lang": self.tgt_lang, "joint": True}

    def tokenizer_texts(self, chunk):
        yield from chunk.src
        yield from chunk.tgt

    @staticmethod
    def scored(split: str) -> bool:
        return split != "train"

    def store_fields(self, writer: StoreWriter, split: str, tok: Tokenizer) -> None:
        writer.add_field("src")
        writer.add_field("tgt")
        if self.scored(split):
            for name in ("src_text", "tgt_text", "references"):
                writer.add_field(name, "text")

    def write_chunk(self, writer: StoreWriter, split: str, tok: Tokenizer, chunk) -> None:
        writer.append("src", *tok.encode_flat(chunk.src))
        writer.append("tgt", *tok.encode_flat(chunk.tgt))
        if self.scored(split):
            writer.append_texts("src_text", chunk.src)
            writer.append_texts("tgt_text", chunk.tgt)
            writer.append_texts("references", [json.dumps(refs, ensure_ascii=False) for refs in chunk.reference_sets()])

    def make_dataset(self, split: str, store: TokenStore, tok: Tokenizer) -> PairDataset:
        src, tgt = store.tokens("src"), store.tokens("tgt")
        texts = None
        if store.has("src_text"):
            texts = (store.texts("src_text"), store.texts("tgt_text"), store.texts("references", json.loads))
        whole = PairDataset(src, tgt, tok.eos, truncate_source=self.truncate_source)
        keep, skipped = filter_by_length(whole.src_sizes, whole.tgt_sizes, self.max_source_positions,
                                         self.max_target_positions)
        self.num_skipped[split] = skipped
        if skipped > self.max_skipped_fraction * len(store) or (split == "train" and len(keep) == 0):
            raise SeqmixError(
                f"{skipped:,} of the {len(store):,} {split} pairs ({skipped / len(store):.1%}) are longer than "
                f"max_source_positions={self.max_source_positions} / max_target_positions={self.max_target_positions}"
                f" (more than max_skipped_fraction={self.max_skipped_fraction}); raise model.max_source_positions / "
                "model.max_target_positions, check that the source and target files are aligned, or allow "
                f"skipping them with ++task.data.max_skipped_fraction={min(1.0, 2 * skipped / len(store)):.2g}")
        if skipped:
            level = logging.INFO if split == "train" else logging.WARNING
            log.log(level, "%s: skipped %d of %d pairs longer than max_source_positions=%d / max_target_positions=%d",
                    split, skipped, len(store), self.max_source_positions, self.max_target_positions)
        return PairDataset(src, tgt, tok.eos, keep, texts, self.truncate_source)

    def describe(self, split: str, store: TokenStore, dataset: PairDataset) -> str:
        return (f"{split}: {len(store):,} pairs, {count_values(store, 'src'):,} source + "
                f"{count_values(store, 'tgt'):,} target tokens; {self.num_skipped.get(split, 0):,} longer than "
                f"max_source_positions={self.max_source_positions} / max_target_positions="
                f"{self.max_target_positions} (skipped)")

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
