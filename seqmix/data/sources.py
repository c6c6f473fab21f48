"""Where parallel text comes from.

Every source turns a split name into a :class:`ParallelCorpus` of raw (untokenized) strings, so the rest of the
pipeline never cares whether the text came from local files, the Hugging Face hub or a generator.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from seqmix.errors import SeqmixError

SPLITS = ("train", "valid", "test")


@dataclass
class ParallelCorpus:
    """Aligned source/target sentences; line i of ``src`` translates to line i of ``tgt``.

    ``references`` optionally holds every reference of example i (``tgt[i]`` is the one trained on), for
    multi-reference scoring; without it each example has ``[tgt[i]]``.
    """

    src: list[str]
    tgt: list[str]
    references: list[list[str]] | None = None

    def __post_init__(self):
        if len(self.src) != len(self.tgt):
            raise ValueError(f"ParallelCorpus needs aligned sides, got {len(self.src)} src vs {len(self.tgt)} tgt")
        if self.references is not None and len(self.references) != len(self.src):
            raise ValueError(f"ParallelCorpus has {len(self.src)} examples but {len(self.references)} reference sets")

    def inputs(self) -> list[str]:
        return self.src

    def reference_sets(self) -> list[list[str]]:
        return self.references if self.references is not None else [[t] for t in self.tgt]

    def __len__(self) -> int:
        return len(self.src)

    def fingerprint(self) -> str:
        """sha256 of the texts: a cache key for sources that cannot hash their files more cheaply."""
        h = hashlib.sha256()
        for side in (self.src, self.tgt):
            h.update(f"{len(side)}\0".encode())
            for line in side:
                h.update(line.encode("utf-8"))
                h.update(b"\0")
        return h.hexdigest()


def _split_lines(text: str) -> list[str]:
    """Split on LF only and drop one trailing CR per line, so other whitespace (incl. U+2028, NBSP) survives."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_text(path: Path) -> str:
    """A plain or gzipped UTF-8 file's text, with one clear error for bad gzip or encoding."""
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise SeqmixError(f"{path} is not a valid gzip file ({e}); re-create or decompress it") from e
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SeqmixError(f"{path} is not UTF-8 (bad byte at offset {e.start}); convert it to UTF-8") from e


def read_lines(path: Path) -> list[str]:
    lines = _split_lines(read_text(path))
    if not lines:
        raise SeqmixError(f"{path} is empty; it must hold one sentence per line")
    return lines


def find_split_file(directory: Path, split: str, name: str, pattern: str) -> Path:
    """``directory/name`` or ``name.gz`` (plain preferred), else an error listing what is there."""
    if not directory.is_dir():
        raise SeqmixError(f"data directory {str(directory)!r} does not exist; set task.data.source.path=<directory "
                          f"holding {name} and the other split files>")
    for candidate in (directory / name, directory / (name + ".gz")):
        if candidate.is_file():
            return candidate
    present = sorted(p.name for p in directory.iterdir()) or ["(no files)"]
    raise SeqmixError(
        f"split {split!r} needs {name} (or {name}.gz) in {directory}, which holds: {', '.join(present)}; "
        f"fix the split name in task.data.splits or the file name pattern task.data.source.pattern={pattern!r}"
    )


class LocalParallelSource:
    """Plain or gzipped line-aligned text files, e.g. ``train.en`` / ``train.de.gz``."""

    def __init__(self, path: str, src_lang: str, tgt_lang: str, pattern: str = "{split}.{lang}"):
        self.path = Path(os.path.expanduser(str(path)))
        self.src_lang, self.tgt_lang, self.pattern = src_lang, tgt_lang, pattern

    def _require_dir(self) -> None:
        if not self.path.is_dir():
            example = self.pattern.format(split="train", lang=self.src_lang)
            raise SeqmixError(
                f"data directory {str(self.path)!r} does not exist; set task.data.source.path=<directory holding "
                f"{example} and the other split files>"
            )

    def _file(self, split: str, lang: str) -> Path:
        """The split file, plain preferred over ``.gz`` when both exist."""
        self._require_dir()
        return find_split_file(self.path, split, self.pattern.format(split=split, lang=lang), self.pattern)

    def available_splits(self) -> list[str]:
        """Split names for which both language files exist."""
        self._require_dir()
        rx = re.escape(self.pattern).replace(re.escape("{split}"), "(?P<split>.+)")
        rx = rx.replace(re.escape("{lang}"), re.escape(self.src_lang))
        names = {p.name.removesuffix(".gz") for p in self.path.iterdir() if p.is_file()}
        found = {m.group("split") for n in names if (m := re.fullmatch(rx, n))}
        return sorted(s for s in found if self.pattern.format(split=s, lang=self.tgt_lang) in names)

    _read_lines = staticmethod(read_lines)

    def read(self, split: str) -> ParallelCorpus:
        src_file, tgt_file = self._file(split, self.src_lang), self._file(split, self.tgt_lang)
        src, tgt = self._read_lines(src_file), self._read_lines(tgt_file)
        if len(src) != len(tgt):
            raise SeqmixError(
                f"{src_file} has {len(src)} lines but {tgt_file} has {len(tgt)}; line i of one must translate "
                f"line i of the other, so fix the files to have equal line counts"
            )
        return ParallelCorpus(src, tgt)

    def fingerprint(self, split: str) -> str:
        """sha256 of the two files' bytes: cheaper than hashing decoded text, and enough to key caches."""
        h = hashlib.sha256()
        for lang in (self.src_lang, self.tgt_lang):
            h.update(f"{lang}\0".encode())
            h.update(self._file(split, lang).read_bytes())
        return h.hexdigest()


class HFParallelSource:
    """A Hugging Face ``datasets`` dataset (hub name, local data files, or a ``save_to_disk`` directory)."""

    def __init__(
        self,
        name: str | None,
        src_lang: str,
        tgt_lang: str,
        config: str | None = None,
        data_files: dict | None = None,
        load_from_disk: str | None = None,
        cache_dir: str | None = None,
        split_names: dict | None = None,
        field: str = "translation",
        revision: str | None = None,
    ):
        if name is None and load_from_disk is None:
            raise SeqmixError(
                "HFParallelSource needs a dataset: set task.data.source.name=<hub name or builder such as json> "
                "or task.data.source.load_from_disk=<directory written by save_to_disk>"
            )
        self.name, self.config, self.revision = name, config, revision
        self.src_lang, self.tgt_lang, self.field = src_lang, tgt_lang, field
        self.data_files = dict(data_files) if data_files is not None else None
        self.load_from_disk = os.path.expanduser(load_from_disk) if load_from_disk else None
        self.cache_dir = os.path.expanduser(cache_dir) if cache_dir else None
        self.split_names = dict(split_names or {})
        self._splits = None  # DatasetDict, loaded once on first read

    def _describe(self) -> str:
        if self.load_from_disk:
            return f"the dataset saved at {self.load_from_disk}"
        return f"Hugging Face dataset {self.name!r}" + (f" (config {self.config!r})" if self.config else "")

    def _load(self):
        """Load every split at once so a wrong split name can be answered with the list of real ones."""
        if self._splits is not None:
            return self._splits
        import datasets

        try:
            if self.load_from_disk:
                loaded = datasets.load_from_disk(self.load_from_disk)
            else:
                loaded = datasets.load_dataset(
                    self.name, self.config, data_files=self.data_files, cache_dir=self.cache_dir,
                    revision=self.revision,
                )
        except Exception as e:  # the library raises many types (ConnectionError, FileNotFoundError, ValueError...)
            raise SeqmixError(
                f"could not load {self._describe()}: {type(e).__name__}: {e}. The hub may be unreachable "
                f"(offline) or the name/config may be wrong; download it once elsewhere and set "
                f"task.data.source.load_from_disk=<directory written by save_to_disk>, or point task.data.source.data_files "
                f"at local json/csv/parquet files (HF_DATASETS_OFFLINE=1 skips the network retries)"
            ) from e
        if isinstance(loaded, datasets.Dataset):  # a bare Dataset was saved: treat it as the train split
            loaded = datasets.DatasetDict({"train": loaded})
        self._splits = loaded
        return loaded

    def available_splits(self) -> list[str]:
        return sorted(self._load().keys())

    def _dataset(self, split: str):
        splits = self._load()
        hf_split = self.split_names.get(split, split)
        if hf_split not in splits:
            raise SeqmixError(
                f"{self._describe()} has no split {hf_split!r} (asked for {split!r}); it has "
                f"{sorted(splits.keys())}; map it with task.data.source.split_names={{{split}: <one of those>}} "
                f"or fix task.data.splits"
            )
        return splits[hf_split]

    def read(self, split: str) -> ParallelCorpus:
        ds = self._dataset(split)
        return ParallelCorpus(self._column(ds, self.src_lang), self._column(ds, self.tgt_lang))

    def _column(self, ds, lang: str) -> list[str]:
        """Text of one language, from ``{field: {lang: ...}}`` records or a flat ``lang`` column."""
        if self.field in ds.column_names:
            flat = ds.select_columns([self.field]).flatten()
            column = f"{self.field}.{lang}"
            if column not in flat.column_names:
                found = [c.split(".", 1)[-1] for c in flat.column_names]
                raise SeqmixError(
                    f"{self._describe()} records have no language {lang!r} under {self.field!r} "
                    f"(found {found}); fix task.src_lang / task.tgt_lang"
                )
            return list(flat[column])
        if lang in ds.column_names:
            return list(ds[lang])
        raise SeqmixError(
            f"{self._describe()} has neither a {self.field!r} column nor a {lang!r} column (columns: "
            f"{ds.column_names}); set task.data.source.field to the column holding {{lang: text}} records, or fix the "
            f"language codes"
        )


class ToyReverseSource:
    """Built-in generated task (no download): target = source words reversed.

    Small enough to learn in minutes on a CPU, so it checks that a model and the training loop work at all.
    """

    _CONSONANTS = "kzmtpsnrlbdgfhjvw"
    _VOWELS = "aeiou"

    def __init__(
        self,
        num_train: int = 6000,
        num_valid: int = 300,
        num_test: int = 300,
        vocab_size: int = 24,
        min_len: int = 3,
        max_len: int = 12,
        seed: int = 1234,
    ):
        if not 1 <= min_len <= max_len:
            raise SeqmixError(f"ToyReverseSource needs 1 <= min_len <= max_len, got {min_len}..{max_len}; fix them")
        if vocab_size < 1:
            raise SeqmixError(f"ToyReverseSource needs vocab_size >= 1, got {vocab_size}")
        self.sizes = {"train": num_train, "valid": num_valid, "test": num_test}
        self.min_len, self.max_len, self.seed = min_len, max_len, seed
        self.words = [self._word(i) for i in range(vocab_size)]

    @classmethod
    def _word(cls, i: int) -> str:
        """i-th word in bijective base-85 over consonant+vowel syllables: ka, ke, ..., then kaka, kake, ..."""
        syllables = [c + v for c in cls._CONSONANTS for v in cls._VOWELS]
        parts = []
        i += 1
        while i > 0:
            i, r = divmod(i - 1, len(syllables))
            parts.append(syllables[r])
        return "".join(reversed(parts))

    def read(self, split: str) -> ParallelCorpus:
        if split not in self.sizes:
            raise SeqmixError(f"ToyReverseSource has splits {list(SPLITS)}, not {split!r}; fix task.data.splits")
        # (seed, split index) seeds an independent stream per split, so splits never share a generator.
        rng = np.random.default_rng([self.seed, SPLITS.index(split)])
        src, tgt = [], []
        for _ in range(self.sizes[split]):
            n = int(rng.integers(self.min_len, self.max_len + 1))
            words = [self.words[j] for j in rng.integers(0, len(self.words), size=n)]
            src.append(" ".join(words))
            tgt.append(" ".join(reversed(words)))
        return ParallelCorpus(src, tgt)
