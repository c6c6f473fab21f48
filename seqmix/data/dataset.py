"""Encoded sentence pairs and how a list of them becomes one padded training batch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from seqmix.data.ragged import Ragged
from seqmix.data.tokenizer import Tokenizer


class Selected(Sequence):
    """``items[index[i]]`` for every i: the kept rows of a split, without copying the split."""

    def __init__(self, items: Sequence, index: np.ndarray | None):
        self.items, self.index = items, index

    def __len__(self) -> int:
        return len(self.items) if self.index is None else len(self.index)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"item {i} of {len(self)}")
        i %= len(self)
        return self.items[i if self.index is None else int(self.index[i])]


def _compact_index(keep: np.ndarray, total: int) -> np.ndarray | None:
    """None when every row is kept, else the kept row numbers in the smallest integer type that holds them."""
    if len(keep) == total:
        return None
    return keep.astype(np.int32 if total < np.iinfo(np.int32).max else np.int64)


class PairDataset(torch.utils.data.Dataset):
    """Encoded pairs (rows of a memory-mapped token store, or small in-memory ones), ``eos`` appended on access.

    ``keep`` selects the rows the model can take (see :func:`filter_by_length`) without copying anything;
    ``truncate_source`` keeps the first N source tokens (summarization). ``texts``: raw ``(sources, targets,
    references)`` sequences of every row, for splits that are scored; training splits carry none.
    """

    def __init__(self, src: Ragged, tgt: Ragged, eos: int = Tokenizer.eos, keep: np.ndarray | None = None,
                 texts: tuple[Sequence, Sequence, Sequence] | None = None, truncate_source: int | None = None):
        if len(src) != len(tgt):
            raise ValueError(f"PairDataset needs as many sources as targets, got {len(src)} and {len(tgt)}")
        if texts is not None and not all(len(t) == len(src) for t in texts):
            raise ValueError("PairDataset needs one source text, target text and reference set per pair")
        self.src, self.tgt, self.eos, self.truncate_source = src, tgt, eos, truncate_source
        self.index = None if keep is None else _compact_index(np.asarray(keep), len(src))
        self._texts = texts
        # Sizes as batched (with eos): what length filtering and the token budget must see.
        self.src_sizes = self._select(self._batched(src.sizes, truncate_source))
        self.tgt_sizes = self._select(self._batched(tgt.sizes, None))

    @classmethod
    def from_lists(cls, src: list[list[int]], tgt: list[list[int]], src_texts: list[str], tgt_texts: list[str],
                   eos: int = Tokenizer.eos, references: list[list[str]] | None = None) -> PairDataset:
        """Small in-memory data (inputs to decode, tests)."""
        refs = references if references is not None else [[t] for t in tgt_texts]
        return cls(Ragged.from_rows(src), Ragged.from_rows(tgt), eos, texts=(src_texts, tgt_texts, refs))

    @staticmethod
    def _batched(sizes: np.ndarray, cap: int | None) -> np.ndarray:
        sizes = np.asarray(sizes)
        if cap is not None:
            sizes = np.minimum(sizes, cap)
        return sizes.astype(np.int32) + 1

    def _select(self, array: np.ndarray) -> np.ndarray:
        return array if self.index is None else array[self.index]

    def row(self, i: int) -> int:
        """The store row of example ``i``."""
        return i if self.index is None else int(self.index[i])

    def __len__(self) -> int:
        return len(self.src) if self.index is None else len(self.index)

    def _with_eos(self, tokens: np.ndarray) -> torch.Tensor:
        out = torch.empty(len(tokens) + 1, dtype=torch.long)
        out[:-1] = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
        out[-1] = self.eos
        return out

    def __getitem__(self, i: int) -> dict:
        j = self.row(i)
        return {"id": i, "source": self._with_eos(self.src[j][: self.truncate_source]),
                "target": self._with_eos(self.tgt[j])}

    def _text(self, k: int, what: str) -> Sequence:
        if self._texts is None:
            raise ValueError(f"this split keeps no {what} (only scored splits keep their raw text)")
        return Selected(self._texts[k], self.index)

    @property
    def src_texts(self) -> Sequence[str]:
        return self._text(0, "source texts")

    @property
    def tgt_texts(self) -> Sequence[str]:
        return self._text(1, "target texts")

    @property
    def references(self) -> Sequence[list[str]]:
        """Every reference of each example (``[target text]`` unless the data has several)."""
        return self._text(2, "references")


def _pad_right(seqs: list[torch.Tensor], pad: int) -> torch.Tensor:
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=torch.long)
    for row, s in enumerate(seqs):
        out[row, : len(s)] = s
    return out


def collate_pairs(samples: list[dict], pad: int, bos: int, eos: int) -> dict:
    """Right-padded batch in input order; decoder input is the target shifted right behind ``bos``
    (teacher forcing), so ``prev_output_tokens[:, t]`` predicts ``target[:, t]``."""
    if not samples:
        return {}
    targets = [s["target"] for s in samples]
    start = torch.tensor([bos], dtype=torch.long)
    prev = [torch.cat([start, t[:-1]]) for t in targets]  # targets end in eos, which is never an input
    target = _pad_right(targets, pad)
    return {
        "id": torch.tensor([s["id"] for s in samples], dtype=torch.long),
        "src_tokens": _pad_right([s["source"] for s in samples], pad),
        "src_lengths": torch.tensor([len(s["source"]) for s in samples], dtype=torch.long),
        "prev_output_tokens": _pad_right(prev, pad),
        "target": target,
        "ntokens": int((target != pad).sum()),
        "nsentences": len(samples),
    }


def filter_by_length(src_sizes, tgt_sizes, max_source_positions: int,
                     max_target_positions: int) -> tuple[np.ndarray, int]:
    """Indices of pairs that fit the model's positions (sizes include eos), and how many were skipped."""
    src_sizes, tgt_sizes = np.asarray(src_sizes), np.asarray(tgt_sizes)
    keep = np.flatnonzero((src_sizes <= max_source_positions) & (tgt_sizes <= max_target_positions))
    return keep, int(len(src_sizes) - len(keep))
