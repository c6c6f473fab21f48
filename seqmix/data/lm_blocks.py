"""Cutting a token stream into language-modeling samples, so that every token is predicted exactly once.

A split is one stream ``S = [</s>, line_1, </s>, line_2, </s>, ...]``: each line's ids followed by ``</s>``, with
one leading ``</s>`` as the context of the very first token. Targets are the positions ``1..N`` of ``S``; a sample
covers a target range ``[a, b)`` and reads ``S[a-1 : b-1]`` (the targets shifted right by one).

- ``break_mode="none"``: contiguous blocks of ``tokens_per_sample`` targets, ignoring line boundaries
  (WikiText, Baevski & Auli 2019).
- ``break_mode="eos"``: one sample per line, never crossing a boundary, so sentences are modelled independently
  (lm1b, Wu et al. 2019 §5.2); a line longer than ``tokens_per_sample`` continues in further samples.

``context`` (evaluation, ``none`` mode only) prepends up to that many earlier tokens to each sample's input
without scoring them (their targets are padding): every scored token then sees at least ``context`` tokens of
history where the stream has them, which lowers perplexity towards what an unbounded-context model would get.
"""

from __future__ import annotations

import numpy as np
import torch

from seqmix.errors import SeqmixError

BREAK_MODES = ("none", "eos")


def token_stream(lines: list[list[int]], eos: int) -> torch.Tensor:
    """``[eos] + line_1 + [eos] + line_2 + [eos] ...`` as int64 (small in-memory data; stores hold it mapped)."""
    flat = [eos]
    for ids in lines:
        flat.extend(ids)
        flat.append(eos)
    return torch.tensor(flat, dtype=torch.long)


def _check(tokens_per_sample: int, break_mode: str) -> None:
    if tokens_per_sample < 1:
        raise SeqmixError(f"tokens_per_sample={tokens_per_sample} must be >= 1")
    if break_mode not in BREAK_MODES:
        raise SeqmixError(f"break_mode={break_mode!r} is unknown; choose one of {list(BREAK_MODES)}")


def block_bounds(line_offsets: np.ndarray, tokens_per_sample: int, break_mode: str = "none"):
    """(starts, ends, sizes) of the samples' target ranges over a stream whose line i occupies
    ``[line_offsets[i], line_offsets[i+1])`` (its eos included; ``line_offsets[0] == 1``, after the leading eos).

    Computed with numpy from the offsets alone. In ``eos`` mode, when no line is longer than a sample (the usual
    case: lm1b), the samples are the lines and the arrays are views of the (memory-mapped) offsets: no copy.
    """
    _check(tokens_per_sample, break_mode)
    offsets = np.asarray(line_offsets)
    total = int(offsets[-1]) - 1 if len(offsets) else 0
    if break_mode == "none":
        starts = np.arange(1, total + 1, tokens_per_sample, dtype=np.int64)
        ends = np.minimum(starts + tokens_per_sample, total + 1)
        return starts, ends, ends - starts
    line_starts, line_ends = offsets[:-1], offsets[1:]
    sizes = line_ends - line_starts
    if len(sizes) == 0 or int(sizes.max()) <= tokens_per_sample:
        return line_starts, line_ends, sizes
    counts = (sizes + tokens_per_sample - 1) // tokens_per_sample
    first = np.repeat(np.cumsum(counts) - counts, counts)
    starts = np.repeat(line_starts, counts) + tokens_per_sample * (np.arange(int(counts.sum())) - first)
    ends = np.minimum(starts + tokens_per_sample, np.repeat(line_ends, counts))
    return starts, ends, ends - starts


class BlockDataset(torch.utils.data.Dataset):
    """Samples ``{"id", "input", "target"}`` over a stream (a tensor, or a memory-mapped array); context positions
    have ``pad`` targets. Sample i scores targets ``starts[i]:ends[i]``."""

    def __init__(self, stream, starts: np.ndarray, ends: np.ndarray, pad: int, context: int = 0,
                 sizes: np.ndarray | None = None) -> None:
        self.stream, self.starts, self.ends, self.pad = stream, starts, ends, pad
        self.context = int(context)
        self.context_sizes = np.minimum(np.asarray(starts) - 1, self.context) if self.context else None
        lengths = np.asarray(ends) - np.asarray(starts) if sizes is None else sizes
        # input length = what a batch costs
        self.sizes = lengths if self.context_sizes is None else lengths + self.context_sizes

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def ranges(self) -> np.ndarray:
        """(n, 2) target ranges (materialized: small data and tests)."""
        return np.stack([np.asarray(self.starts, dtype=np.int64), np.asarray(self.ends, dtype=np.int64)], axis=1)

    @property
    def num_targets(self) -> int:
        return int(np.sum(np.asarray(self.ends) - np.asarray(self.starts), dtype=np.int64))

    def _slice(self, a: int, b: int) -> torch.Tensor:
        part = self.stream[a:b]
        return part.clone() if isinstance(part, torch.Tensor) else torch.from_numpy(np.asarray(part, dtype=np.int64))

    def __getitem__(self, i: int) -> dict:
        a, b = int(self.starts[i]), int(self.ends[i])
        c = 0 if self.context_sizes is None else int(self.context_sizes[i])
        target = self._slice(a - c, b)
        target[:c] = self.pad
        return {"id": i, "input": self._slice(a - 1 - c, b - 1), "target": target}


def blocks_over(stream, line_offsets: np.ndarray, pad: int, tokens_per_sample: int, break_mode: str = "none",
                context: int = 0) -> BlockDataset:
    """Samples over a stream and its line offsets (what the data module reads from a token store)."""
    if context and break_mode != "none":
        raise SeqmixError(f"eval_context={context} needs break_mode=none: with break_mode={break_mode!r} every line "
                          "is modelled alone, and earlier context would cross into the previous lines")
    starts, ends, sizes = block_bounds(line_offsets, tokens_per_sample, break_mode)
    return BlockDataset(stream, starts, ends, pad, context, sizes)


def make_blocks(lines: list[list[int]], eos: int, pad: int, tokens_per_sample: int, break_mode: str = "none",
                context: int = 0) -> BlockDataset:
    """Encoded lines -> their stream -> samples (small in-memory data: ``generate.py`` inputs, tests)."""
    offsets = np.concatenate([[1], 1 + np.cumsum([len(ids) + 1 for ids in lines], dtype=np.int64)])
    return blocks_over(token_stream(lines, eos), offsets, pad, tokens_per_sample, break_mode, context)


def collate_blocks(samples: list[dict], pad: int) -> dict:
    """Right-padded batch; ``target[:, t]`` is what ``tokens[:, :t+1]`` predicts."""
    if not samples:
        return {}
    length = max(len(s["input"]) for s in samples)
    tokens = torch.full((len(samples), length), pad, dtype=torch.long)
    target = torch.full((len(samples), length), pad, dtype=torch.long)
    for row, s in enumerate(samples):
        tokens[row, : len(s["input"])] = s["input"]
        target[row, : len(s["target"])] = s["target"]
    return {
        "id": torch.tensor([s["id"] for s in samples], dtype=torch.long),
        "tokens": tokens,
        "target": target,
        "ntokens": int(target.ne(pad).sum()),
    }
