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
from collections.abc import Sequence
from pathlib import Path

from seqmix.data.sources import ParallelCorpus, _split_lines, find_split_file, read_text
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

    def _file(self, split: str) -> Path:
        return find_split_file(self.path, split, self.pattern.format(split=split), self.pattern)

    def read(self, split: str) -> ParallelCorpus:
        path = self._file(split)
        lines = [line for line in _split_lines(read_text(path)) if line.strip()]
        if not lines:
            raise SeqmixError(f"{path} is empty; it must hold one record per line")
        src, refs = [], []
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
            src.append(" ".join(_texts(record[self.source_field])))
            refs.append(summaries)
        return ParallelCorpus(src, [r[0] for r in refs], references=refs)

    def fingerprint(self, split: str) -> str:
        h = hashlib.sha256(json.dumps([self.source_field, self.target_fields]).encode())
        h.update(self._file(split).read_bytes())
        return h.hexdigest()
