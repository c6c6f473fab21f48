"""Encoded sentence pairs and how a list of them becomes one padded training batch."""

from __future__ import annotations

import numpy as np
import torch

from seqmix.data.tokenizer import Tokenizer


class PairDataset(torch.utils.data.Dataset):
    """Encoded pairs, eos appended, plus the raw texts (kept for references and debugging) and every reference
    of each example (``[tgt_text]`` unless the data has several)."""

    def __init__(self, src: list[list[int]], tgt: list[list[int]], src_texts: list[str], tgt_texts: list[str],
                 eos: int = Tokenizer.eos, references: list[list[str]] | None = None):
        if not len(src) == len(tgt) == len(src_texts) == len(tgt_texts):
            raise ValueError("PairDataset needs src, tgt, src_texts and tgt_texts of equal length")
        if references is not None and len(references) != len(src):
            raise ValueError("PairDataset needs one reference set per example")
        self.src, self.tgt, self.src_texts, self.tgt_texts, self.eos = src, tgt, src_texts, tgt_texts, eos
        self.references = references if references is not None else [[t] for t in tgt_texts]
        # Sizes as batched (with eos): what length filtering and the token budget must see.
        self.src_sizes = np.fromiter((len(s) + 1 for s in src), dtype=np.int64, count=len(src))
        self.tgt_sizes = np.fromiter((len(t) + 1 for t in tgt), dtype=np.int64, count=len(tgt))

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> dict:
        return {
            "id": i,
            "source": torch.tensor(self.src[i] + [self.eos], dtype=torch.long),
            "target": torch.tensor(self.tgt[i] + [self.eos], dtype=torch.long),
        }


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
