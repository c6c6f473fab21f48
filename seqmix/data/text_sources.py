"""Where language-modeling text comes from: one line = one document or sentence (as WikiText and lm1b ship).

Every source turns a split name into a :class:`TextCorpus` of raw lines (streamed in chunks by ``iter_chunks``, as
the parallel sources do); the data module appends ``</s>`` after each line (so blank lines become a lone ``</s>``,
as in the standard WikiText token counts).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from seqmix.data.sources import (
    CHUNK_SIZE,
    HFParallelSource,
    chunked,
    concat_chunks,
    find_split_file,
    hash_file,
    iter_lines,
    require_lines,
)
from seqmix.errors import SeqmixError


@dataclass
class TextCorpus:
    lines: list[str]

    def __len__(self) -> int:
        return len(self.lines)

    def inputs(self) -> list[str]:
        return self.lines

    def reference_sets(self) -> None:
        """Language-modeling text has nothing to compare generated text against."""
        return None

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for line in self.lines:
            h.update(line.encode("utf-8"))
            h.update(b"\0")
        return h.hexdigest()


class LocalTextSource:
    """Plain or gzipped text files, e.g. ``train.txt`` / ``valid.txt.gz`` (pattern ``{split}.txt``)."""

    def __init__(self, path: str, pattern: str = "{split}.txt") -> None:
        self.path = Path(os.path.expanduser(str(path)))
        self.pattern = pattern

    def file_names(self, split: str) -> list[str]:
        """The file (plain, or gzipped with ``.gz`` added) that ``split`` reads from ``path``."""
        return [self.pattern.format(split=split)]

    def _file(self, split: str) -> Path:
        return find_split_file(self.path, split, self.pattern.format(split=split), self.pattern)

    def iter_chunks(self, split: str, chunk_size: int = CHUNK_SIZE) -> Iterator[TextCorpus]:
        path = self._file(split)
        for lines in chunked(require_lines(iter_lines(path), path), chunk_size):
            yield TextCorpus(lines)

    def read(self, split: str) -> TextCorpus:
        return concat_chunks(TextCorpus, self.iter_chunks(split))

    def fingerprint(self, split: str) -> str:
        """sha256 of the file's bytes (streamed)."""
        return hash_file(self._file(split)).hexdigest()


class HFTextSource(HFParallelSource):
    """One text column of a Hugging Face ``datasets`` dataset (hub name, local data files or a saved folder),
    e.g. ``wikitext``/``wikitext-103-v1`` or ``lm1b``, column ``text``. Trailing newlines of rows are dropped;
    ``streaming`` as for :class:`HFParallelSource`."""

    def __init__(self, name: str | None, text_field: str = "text", config: str | None = None,
                 data_files: dict | None = None, load_from_disk: str | None = None, cache_dir: str | None = None,
                 split_names: dict | None = None, revision: str | None = None, streaming: bool = False) -> None:
        super().__init__(name, text_field, text_field, config=config, data_files=data_files,
                         load_from_disk=load_from_disk, cache_dir=cache_dir, split_names=split_names,
                         revision=revision, streaming=streaming)
        self.text_field = text_field

    def _getters(self, ds) -> list:
        if self.text_field not in ds.column_names:
            raise SeqmixError(f"{self._describe()} has no {self.text_field!r} column (columns: {ds.column_names}); "
                              "set task.data.source.text_field")
        return [(self.text_field, self.flat_column(self.text_field))]

    def _read_key(self) -> list:
        return [self.text_field]

    def iter_chunks(self, split: str, chunk_size: int = CHUNK_SIZE) -> Iterator[TextCorpus]:
        ds = self._dataset(split)
        [(column, text)] = self._getters(ds)
        for batch in self._batches(ds, [column], chunk_size):
            yield TextCorpus([line.rstrip("\n") for line in text(batch)])

    def read(self, split: str) -> TextCorpus:
        return concat_chunks(TextCorpus, self.iter_chunks(split))
