"""Sequence-level knowledge distillation data (Kim & Rush 2016): an autoregressive teacher's translations of the
training sources replace the training targets; validation and test keep the real references.

``generate.py ... split=train distill_dir=<dir>`` writes ``<dir>/{split}.{lang}`` with ``write_distilled``;
``DistilledTrainSource`` (``task.data.source._target_``) reads the training split from there and every other
split from the task's own source, so a non-autoregressive model trains on the teacher's outputs.
"""

from __future__ import annotations

import inspect
import os
import pydoc
from collections.abc import Iterator
from pathlib import Path

from seqmix.data.sources import CHUNK_SIZE, LocalParallelSource, ParallelCorpus
from seqmix.errors import SeqmixError
from seqmix.files import atomic_write_text


def write_distilled(directory: str | Path, split: str, src_lang: str, tgt_lang: str, sources: list[str],
                    translations: list[str], pattern: str = "{split}.{lang}") -> list[Path]:
    """Write aligned ``sources`` / ``translations`` as a local split; returns the two files."""
    if len(sources) != len(translations):
        raise SeqmixError(f"{len(sources)} sources but {len(translations)} translations; nothing written")
    out = Path(os.path.expanduser(str(directory)))
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for lang, lines in ((src_lang, sources), (tgt_lang, translations)):
        if any("\n" in line for line in lines):
            raise SeqmixError(f"a {lang} line contains a newline; it cannot be written one sentence per line")
        path = out / pattern.format(split=split, lang=lang)
        atomic_write_text(path, "".join(line + "\n" for line in lines))
        paths.append(path)
    return paths


class DistilledTrainSource:
    """The task's source (``base_target`` built from the remaining keyword arguments), except that the training
    split ``train_split`` comes from ``distilled_path`` when it is set (null: the real data, unchanged)."""

    def __init__(self, base_target: str, src_lang: str, tgt_lang: str, distilled_path: str | None = None,
                 train_split: str = "train", distilled_pattern: str = "{split}.{lang}", **base_kwargs) -> None:
        base_cls = pydoc.locate(base_target)
        if not callable(base_cls):
            raise SeqmixError(f"base_target={base_target!r} names no class: give a data source class such as "
                              "seqmix.data.LocalParallelSource")
        accepted = inspect.signature(base_cls).parameters
        langs = {k: v for k, v in (("src_lang", src_lang), ("tgt_lang", tgt_lang)) if k in accepted}
        self.base = base_cls(**langs, **base_kwargs)
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.train_split = train_split
        self.distilled = None
        if distilled_path:
            path = Path(os.path.expanduser(str(distilled_path)))
            if not path.is_dir():
                raise SeqmixError(f"distilled data directory {str(path)!r} does not exist; write it with "
                                  f"`python generate.py ckpt_path=<teacher>.ckpt split=train beam_size=5 "
                                  f"distill_dir={path}` or unset task.distilled_data")
            self.distilled = LocalParallelSource(str(path), self.src_lang, self.tgt_lang, distilled_pattern)

    def _source_for(self, split: str):
        return self.distilled if self.distilled is not None and split == self.train_split else self.base

    def iter_chunks(self, split: str, chunk_size: int = CHUNK_SIZE) -> Iterator[ParallelCorpus]:
        """The chosen source's chunks; a base source with only ``read`` (a user's own) gives one chunk."""
        source = self._source_for(split)
        if hasattr(source, "iter_chunks"):
            return source.iter_chunks(split, chunk_size)
        return iter([source.read(split)])

    def read(self, split: str) -> ParallelCorpus:
        return self._source_for(split).read(split)

    def fingerprint(self, split: str) -> str:
        source = self._source_for(split)
        own = getattr(source, "fingerprint", None)
        tag = "distilled:" if source is self.distilled else ""
        return tag + (own(split) if callable(own) else source.read(split).fingerprint())
