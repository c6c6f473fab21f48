"""What the translation and language-modeling data modules share: loaders of token-budget batches that the
sampler itself shards across DDP ranks, so Lightning must not add its own distributed sampler."""

from __future__ import annotations

import lightning
from torch.utils.data import DataLoader

from seqmix.data.batching import TokenBudgetBatchSampler
from seqmix.data.resumable_loader import ResumableLoader
from seqmix.errors import SeqmixError


class TokenBudgetDataModule(lightning.LightningDataModule):
    """Subclasses set ``tokenizer``/``datasets`` in ``setup`` and ``max_tokens``, ``max_tokens_valid``, ``seed``,
    ``num_workers`` in ``__init__``; they say how long an example is (``batch_lengths``) and how a batch is
    collated (``collate_fn``)."""

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
