"""Document → summary pairs from local JSON-lines files (DialogSum, SciTLDR, XSum-style records).

Record layouts differ, so the fields are configured: ``source_field`` names the document (a string, or a list
of sentences joined with spaces, as SciTLDR's ``source``); ``target_fields`` names the summaries, in order
(DialogSum: ``summary`` in train/dev but ``summary1..3`` in test; SciTLDR: ``target``, a list of TL;DRs). Every
present, non-empty summary is a reference for scoring; the first one is the training target. A line that is
not JSON is read as a Python dict literal (DialogSum's released train file uses single quotes).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from seqmix.data.sources import (
    CHUNK_SIZE,
    ParallelCorpus,
    chunked,
    concat_chunks,
    find_split_file,
    hash_file,
    iter_lines,
    require_lines,
)
from seqmix.errors import SeqmixError


def parse_record(line: str, where: str) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        try:
            record = ast.literal_eval(line)
        except (ValueError, SyntaxError) as e:
            raise SeqmixError(f"{where} is neither JSON nor a Python dict literal ({e}); fix or remove it") from None
    if not isinstance(record, dict):
        raise SeqmixError(f"{where} holds a {type(record).__name__}, not a record ({{field: value}})")
    return record


def _texts(value) -> list[str]:
    """A field's text(s): a string, or a list of strings; empty ones dropped."""
    items = value if isinstance(value, list) else [value]
    return [str(v).strip() for v in items if v is not None and str(v).strip()]


class JsonlSummarySource:
    def __init__(self, path: str, source_field: str, target_fields: Sequence[str],
                 pattern: str = "{split}.jsonl") -> None:
        self.path = Path(os.path.expanduser(str(path)))
        self.source_field = source_field
        self.target_fields = list(target_fields)
        if not self.target_fields:
            raise SeqmixError("task.data.source.target_fields is empty; name the summary field(s) of the records")
        self.pattern = pattern

    def file_names(self, split: str) -> list[str]:
        """The file (plain, or gzipped with ``.gz`` added) that ``split`` reads from ``path``."""
        return [self.pattern.format(split=split)]

    def _file(self, split: str) -> Path:
        return find_split_file(self.path, split, self.pattern.format(split=split), self.pattern)

    def _examples(self, path: Path) -> Iterator[tuple[str, list[str]]]:
        """(document, summaries) per non-blank line, streamed; lines are numbered among the non-blank ones."""
        lines = require_lines((line for line in iter_lines(path) if line.strip()), path, "one record per line")
        for n, line in enumerate(lines, 1):
            where = f"{path} line {n}"
            record = parse_record(line, where)
            if self.source_field not in record:
                raise SeqmixError(f"{where} has no {self.source_field!r} field (fields: {sorted(record)}); "
                                  "set task.data.source.source_field")
            summaries = [t for f in self.target_fields if f in record for t in _texts(record[f])]
            if not summaries:
                raise SeqmixError(f"{where} has none of the summary fields {self.target_fields} (fields: "
                                  f"{sorted(record)}); set task.data.source.target_fields")
            yield " ".join(_texts(record[self.source_field])), summaries

    def iter_chunks(self, split: str, chunk_size: int = CHUNK_SIZE) -> Iterator[ParallelCorpus]:
        for examples in chunked(self._examples(self._file(split)), chunk_size):
            refs = [summaries for _, summaries in examples]
            yield ParallelCorpus([doc for doc, _ in examples], [r[0] for r in refs], references=refs)

    def read(self, split: str) -> ParallelCorpus:
        return concat_chunks(ParallelCorpus, self.iter_chunks(split))

    def fingerprint(self, split: str) -> str:
        h = hashlib.sha256(json.dumps([self.source_field, self.target_fields]).encode())
        return hash_file(self._file(split), h).hexdigest()
