"""Token-budget batches: similar lengths together so little compute is spent on padding.

Examples are sorted by ``max(src_len, tgt_len)`` (then target, then source length), because a batch costs
``n * max(longest source, longest target)`` padded tokens; sorting by that key makes the greedy packing below
optimal for its order and makes the number of batches independent of the shuffle (only ties are shuffled).

Everything is numpy on compact integer arrays (WMT has 4.5M+ pairs): an epoch is the sorted example order plus
batch boundaries into it, and a Python list exists only for the batch being handed to the DataLoader.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from seqmix.errors import SeqmixError

log = logging.getLogger(__name__)


def _as_lengths(values) -> np.ndarray:
    """Integer arrays (memmaps included) are used as they are, without a copy; anything else becomes int64."""
    array = np.asarray(values)
    return array if array.dtype.kind in "iu" else np.asarray(values, dtype=np.int64)


def _sort_keys(src: np.ndarray, tgt: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The rank of ``(size, tgt, src)`` among all length pairs, so one integer sort replaces a three-key lexsort.

    With ``size = max(src, tgt)``, the z*z pairs of size < z come first; within size z come (t, z) for t < z,
    then (z, s) for s <= z. Ranks are dense, so lengths up to 255 fit 16 bits, which numpy sorts fastest.
    """
    dtype = np.min_scalar_type((int(sizes.max()) + 1) ** 2 - 1)
    z = sizes.astype(dtype)
    keys = np.add(z, src, dtype=dtype, casting="unsafe")
    np.copyto(keys, tgt, casting="unsafe", where=tgt < z)
    keys += np.multiply(z, z, out=z)
    return keys


def _stable_argsort(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` by 16-bit digits, least significant first: numpy radix-sorts 16-bit
    integers in linear time but timsorts wider ones, which is an order of magnitude slower on millions of keys."""
    order = None
    for shift in range(0, max(int(keys.max()).bit_length(), 1), 16):
        digit = (keys >> shift).astype(np.uint16)
        step = np.argsort(digit if order is None else digit[order], kind="stable")
        order = step if order is None else order[step]
    return order


class TokenBudgetBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yields lists of dataset indices whose padded size fits ``max_tokens``; rank-aware, seeded per epoch.

    Every rank builds the same global batch list from (seed, epoch), repeats batches from its start until
    ``world_size`` divides its length (every rank must run the same number of steps, training and evaluation
    alike: evaluation counts a repeated batch once, by its example ids), then takes ``batches[rank::world_size]``.
    ``src_lengths``, ``tgt_lengths`` and ``sizes`` keep compact integer dtypes (e.g. uint16 memmaps).
    """

    def __init__(self, src_lengths, tgt_lengths, max_tokens: int, max_sentences: int | None = None,
                 shuffle: bool = True, seed: int = 1, rank: int = 0, world_size: int = 1):
        self.src_lengths, self.tgt_lengths = _as_lengths(src_lengths), _as_lengths(tgt_lengths)
        if self.src_lengths.shape != self.tgt_lengths.shape:
            raise ValueError("src_lengths and tgt_lengths must have the same length")
        if len(self.src_lengths) and min(self.src_lengths.min(), self.tgt_lengths.min()) < 0:
            raise ValueError("src_lengths and tgt_lengths must be >= 0")
        if max_sentences is not None and max_sentences < 1:
            raise SeqmixError(f"max_sentences={max_sentences} must be >= 1 (or null for no limit)")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        longest = int(max(self.src_lengths.max(), self.tgt_lengths.max())) if len(self.src_lengths) else 0
        self.sizes = np.maximum(self.src_lengths, self.tgt_lengths, dtype=np.min_scalar_type(longest),
                                casting="unsafe")
        if len(self.sizes) and longest > max_tokens:
            raise SeqmixError(
                f"max_tokens={max_tokens} is smaller than one example of {longest} tokens; "
                f"raise max_tokens or lower max_*_positions"
            )
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        self.epoch = 0
        self._bounds = self._pack()
        self._cache: tuple[int, np.ndarray, np.ndarray] | None = None
        self._resume: tuple[int, int] | None = None  # (epoch, batches already trained in it) from a checkpoint
        self.epoch_source: Callable[[], int | None] | None = None  # overrides set_epoch's argument unless it gives None

    @property
    def sampler(self):
        """Lightning calls ``batch_sampler.sampler.set_epoch(epoch)``; pointing at ourselves makes that reach us."""
        return self

    def set_epoch(self, epoch: int) -> None:
        source = None if self.epoch_source is None else self.epoch_source()
        self.epoch = int(epoch if source is None else source)

    def _layout(self) -> dict:
        """What this rank's batch list depends on besides the data: a resume must find the same to skip batches."""
        return {"batches": len(self), "seed": self.seed, "shuffle": self.shuffle, "world_size": self.world_size,
                "rank": self.rank, "max_tokens": self.max_tokens, "max_sentences": self.max_sentences}

    def state_dict(self, trained: int) -> dict:
        """Where training stands: this epoch and the ``trained`` batches of it already done (the loop knows how
        many; the sampler cannot, as loaders fetch ahead), plus what the batch list depends on."""
        return {"epoch": self.epoch, "trained": int(trained), **self._layout()}

    def load_state_dict(self, state: dict) -> None:
        """Continue where ``state`` stopped: its epoch's order, without the batches already trained (the next
        epoch when all were). A sampler whose data or settings changed since starts its epoch from the top."""
        changed = {k: (state.get(k), v) for k, v in self._layout().items() if state.get(k) != v}
        if changed:
            log.warning("the training batches differ from the checkpoint's (%s): the resumed epoch starts from its "
                        "first batch", ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changed.items()))
            return
        epoch, trained = int(state["epoch"]), int(state["trained"])
        if trained >= state["batches"]:
            epoch, trained = epoch + 1, 0
        self.epoch, self._resume = epoch, (epoch, trained)

    def _rng(self, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch, stream])

    def _pack(self) -> np.ndarray:
        """Batch boundaries in the sorted order: batch j is ``order[bounds[j]:bounds[j + 1]]`` in every epoch.

        Sorted sizes ascend, so greedily an example joins the open batch iff the batch, counting it, holds at most
        ``fit = min(max_sentences, max_tokens // size)``. Packing thus depends only on how many examples have each
        size: per distinct size, the open batch fills up to ``fit`` and the rest splits into batches of ``fit``.
        """
        n = len(self.sizes)
        cap = self.max_sentences or n
        counts = np.bincount(self.sizes)
        present = np.flatnonzero(counts)
        starts, pos, taken = [np.zeros(min(n, 1), np.int64)], 0, 0  # taken: examples in the open batch
        for size, count in zip(present.tolist(), counts[present].tolist()):
            fit = int(min(cap, self.max_tokens // size)) if size else cap
            new = np.arange(pos + max(fit - taken, 0), pos + count, fit)
            pos += count
            taken = pos - int(new[-1]) if len(new) else taken + count
            starts.append(new)
        return np.concatenate([*starts, [n]])

    def _shard(self, batch_ids: np.ndarray) -> np.ndarray:
        """This rank's part of the global batch sequence."""
        if self.world_size > 1 and len(batch_ids):
            missing = -len(batch_ids) % self.world_size
            batch_ids = np.concatenate([batch_ids, batch_ids[np.arange(missing) % len(batch_ids)]])
            batch_ids = batch_ids[self.rank :: self.world_size]
        return batch_ids

    def _epoch_batches(self) -> tuple[np.ndarray, np.ndarray]:
        """This epoch's example order (identical on every rank) and this rank's batch ids, in yield order."""
        if self._cache is None or self._cache[0] != self.epoch:
            n = len(self.sizes)
            order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
            if self.shuffle:
                self._rng(0).shuffle(order)  # the permutation of permutation(n), without an int64 copy
            if n:
                # A stable sort keeps equal keys in the shuffled order, so ties come out differently each epoch.
                order = order[_stable_argsort(_sort_keys(self.src_lengths, self.tgt_lengths, self.sizes)[order])]
            n_batches = len(self._bounds) - 1
            batch_ids = self._rng(1).permutation(n_batches) if self.shuffle else np.arange(n_batches)
            self._cache = (self.epoch, order, self._shard(batch_ids))
        return self._cache[1], self._cache[2]

    def __iter__(self):
        order, batch_ids = self._epoch_batches()
        if self._resume is not None:  # every iterator of the resumed epoch skips what was trained
            epoch, trained = self._resume
            if epoch == self.epoch:
                batch_ids = batch_ids[trained:]
            else:
                self._resume = None
        bounds = self._bounds
        return (order[bounds[j] : bounds[j + 1]].tolist() for j in batch_ids.tolist())

    def __len__(self) -> int:
        return len(self._shard(np.arange(len(self._bounds) - 1)))
