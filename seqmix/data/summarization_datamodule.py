"""The translation data module for document → summary pairs: long documents are truncated, not skipped."""

from __future__ import annotations

from seqmix.data.translation_datamodule import TranslationDataModule
from seqmix.errors import SeqmixError


class SummarizationDataModule(TranslationDataModule):
    """``truncate_source``: keep the first N subword tokens of every document (400 for CNN-DM, as See et al. 2017
    and Wu et al. 2019), before the end-of-sequence token; null keeps documents whole (and too-long pairs are
    skipped, as in translation). Truncation happens when rows are read, so the store keeps whole documents."""

    def __init__(self, *args, truncate_source: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if truncate_source is not None and not 1 <= truncate_source < self.max_source_positions:
            raise SeqmixError(f"task.data.truncate_source={truncate_source} must be between 1 and "
                              f"max_source_positions - 1 = {self.max_source_positions - 1} (one position is the eos)")
        self.truncate_source = truncate_source
