"""Token-budget batches: similar lengths together so little compute is spent on padding.

Examples are sorted by ``max(src_len, tgt_len)`` (then target, then source length), because a batch costs
``n * max(longest source, longest target)`` padded tokens; sorting by that key makes the greedy packing below
optimal for its order and makes the number of batches independent of the shuffle (only ties are shuffled).
"""

from __future__ import annotations

import numpy as np
import torch

from seqmix.errors import SeqmixError


class TokenBudgetBatchSampler(torch.utils.data.Sampler[list[int]]):
    """Yields lists of dataset indices whose padded size fits ``max_tokens``; rank-aware, seeded per epoch.

    Every rank builds the same global batch list from (seed, epoch), then takes ``batches[rank::world_size]``.
    ``pad_to_equal`` (training) repeats batches from the start so all ranks get equal counts; ``drop_uneven``
    instead drops the last ``len % world_size`` batches; with neither (evaluation) each example is seen once.
    """

    def __init__(self, src_lengths, tgt_lengths, max_tokens: int, max_sentences: int | None = None,
                 shuffle: bool = True, seed: int = 1, rank: int = 0, world_size: int = 1,
                 drop_uneven: bool = False, pad_to_equal: bool = True):
        self.src_lengths = np.asarray(src_lengths, dtype=np.int64)
        self.tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64)
        if self.src_lengths.shape != self.tgt_lengths.shape:
            raise ValueError("src_lengths and tgt_lengths must have the same length")
        if max_sentences is not None and max_sentences < 1:
            raise SeqmixError(f"max_sentences={max_sentences} must be >= 1 (or null for no limit)")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
        self.sizes = np.maximum(self.src_lengths, self.tgt_lengths)
        if len(self.sizes) and self.sizes.max() > max_tokens:
            raise SeqmixError(
                f"max_tokens={max_tokens} is smaller than one example of {int(self.sizes.max())} tokens; "
                f"raise max_tokens or lower max_*_positions"
            )
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        self.shuffle, self.seed, self.rank, self.world_size = shuffle, seed, rank, world_size
        self.drop_uneven, self.pad_to_equal = drop_uneven, pad_to_equal
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None

    @property
    def sampler(self):
        """Lightning calls ``batch_sampler.sampler.set_epoch(epoch)``; pointing at ourselves makes that reach us."""
        return self

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def _rng(self, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.epoch, stream])

    def _all_batches(self) -> list[list[int]]:
        """The global batch list of this epoch, identical on every rank."""
        n = len(self.sizes)
        order = self._rng(0).permutation(n) if self.shuffle else np.arange(n)
        # lexsort: last key is primary; stable, so equal-length examples keep the (shuffled) order.
        order = order[np.lexsort((self.src_lengths[order], self.tgt_lengths[order], self.sizes[order]))]
        batches, current, longest = [], [], 0
        cap = self.max_sentences or n
        for i in order.tolist():
            size = int(self.sizes[i])
            grown = max(longest, size)
            if current and (len(current) + 1 > cap or (len(current) + 1) * grown > self.max_tokens):
                batches.append(current)
                current, grown = [], size
            current.append(i)
            longest = grown
        if current:
            batches.append(current)
        if self.shuffle:
            batches = [batches[j] for j in self._rng(1).permutation(len(batches))]
        return batches

    def _rank_batches(self) -> list[list[int]]:
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1]
        batches = self._all_batches()
        if self.world_size > 1 and batches:
            if self.drop_uneven:
                batches = batches[: len(batches) - len(batches) % self.world_size]
            elif self.pad_to_equal:
                # Repeat batches from the start so every rank runs the same number of steps (DDP needs that).
                missing = -len(batches) % self.world_size
                batches = batches + [batches[j % len(batches)] for j in range(missing)]
            batches = batches[self.rank :: self.world_size]
        self._cache = (self.epoch, batches)
        return batches

    def __iter__(self):
        return iter([list(b) for b in self._rank_batches()])

    def __len__(self) -> int:
        return len(self._rank_batches())
