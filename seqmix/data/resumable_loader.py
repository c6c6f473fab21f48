"""A training loader whose place in the epoch goes into checkpoints, so a run resumed mid-epoch (after a kill, a
preemption, a crash) trains on exactly the batches an uninterrupted run would, in the same order.

Lightning saves and restores the state of loaders that have ``state_dict``/``load_state_dict`` (in the fit loop's
checkpoint entry, before its first batch on resume). How many batches of the epoch are trained is known to the
training loop, not to the loader, which fetches ahead: ``trained_batches`` asks the loop. The epoch whose order
is drawn is the one the trainer is in (``current_epoch``), not the number Lightning passes to ``set_epoch``: after
a resume from a checkpoint written at an epoch's end, that number runs one ahead (Lightning 2.6 counts the
epoch's end twice in ``epoch_progress.processed``), which would skip an epoch's order. The loader draws its
workers' base seed from its own generator, not from torch's global one, so creating an iterator on resume
leaves the dropout stream where the checkpoint left it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.data import DataLoader

from seqmix.data.batching import TokenBudgetBatchSampler


class ResumableLoader(DataLoader):
    def __init__(self, dataset, batch_sampler: TokenBudgetBatchSampler, trained_batches: Callable[[], int],
                 current_epoch: Callable[[], int | None], **kwargs) -> None:
        kwargs.setdefault("generator", torch.Generator().manual_seed(batch_sampler.seed))
        super().__init__(dataset, batch_sampler=batch_sampler, **kwargs)
        self.trained_batches = trained_batches
        batch_sampler.epoch_source = current_epoch

    def state_dict(self) -> dict:
        return self.batch_sampler.state_dict(self.trained_batches())

    def load_state_dict(self, state: dict) -> None:
        self.batch_sampler.load_state_dict(state)
