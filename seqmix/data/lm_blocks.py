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
    """``[eos] + line_1 + [eos] + line_2 + [eos] ...`` as int64."""
    flat = [eos]
    for ids in lines:
        flat.extend(ids)
        flat.append(eos)
    return torch.tensor(flat, dtype=torch.long)


def block_ranges(line_sizes: list[int] | np.ndarray, tokens_per_sample: int, break_mode: str = "none") -> np.ndarray:
    """Target ranges ``(a, b)`` over the stream, ``line_sizes`` counting each line's eos. They tile ``[1, N+1)``."""
    if tokens_per_sample < 1:
        raise SeqmixError(f"tokens_per_sample={tokens_per_sample} must be >= 1")
    if break_mode not in BREAK_MODES:
        raise SeqmixError(f"break_mode={break_mode!r} is unknown; choose one of {list(BREAK_MODES)}")
    sizes = np.asarray(line_sizes, dtype=np.int64)
    total = int(sizes.sum())
    if break_mode == "none":
        starts = np.arange(1, total + 1, tokens_per_sample, dtype=np.int64)
        return np.stack([starts, np.minimum(starts + tokens_per_sample, total + 1)], axis=1)
    ranges = []
    start = 1
    for size in sizes.tolist():
        for a in range(start, start + size, tokens_per_sample):
            ranges.append((a, min(a + tokens_per_sample, start + size)))
        start += size
    return np.asarray(ranges, dtype=np.int64).reshape(-1, 2)


class BlockDataset(torch.utils.data.Dataset):
    """Samples ``{"id", "input", "target"}`` over a stream; context positions have ``pad`` targets."""

    def __init__(self, stream: torch.Tensor, ranges: np.ndarray, pad: int, context: int = 0) -> None:
        self.stream, self.ranges, self.pad = stream, ranges, pad
        self.context = int(context)
        starts = ranges[:, 0]
        self.context_sizes = np.minimum(starts - 1, self.context)
        self.sizes = ranges[:, 1] - starts + self.context_sizes  # input length = what a batch costs

    def __len__(self) -> int:
        return len(self.ranges)

    @property
    def num_targets(self) -> int:
        return int((self.ranges[:, 1] - self.ranges[:, 0]).sum())

    def __getitem__(self, i: int) -> dict:
        a, b = (int(v) for v in self.ranges[i])
        c = int(self.context_sizes[i])
        target = self.stream[a - c: b].clone()
        target[:c] = self.pad
        return {"id": i, "input": self.stream[a - 1 - c: b - 1], "target": target}


def make_blocks(lines: list[list[int]], eos: int, pad: int, tokens_per_sample: int, break_mode: str = "none",
                context: int = 0) -> BlockDataset:
    """Encoded lines -> their stream -> samples (what the data module and ``generate.py`` both use)."""
    if context and break_mode != "none":
        raise SeqmixError(f"eval_context={context} needs break_mode=none: with break_mode={break_mode!r} every line "
                          "is modelled alone, and earlier context would cross into the previous lines")
    ranges = block_ranges([len(ids) + 1 for ids in lines], tokens_per_sample, break_mode)
    return BlockDataset(token_stream(lines, eos), ranges, pad, context)


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
