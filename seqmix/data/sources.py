"""Where parallel text comes from.

Every source turns a split name into a :class:`ParallelCorpus` of raw (untokenized) strings, so the rest of the
pipeline never cares whether the text came from local files, the Hugging Face hub or a generator. Sources stream:
``iter_chunks(split, chunk_size)`` yields the split in corpora of at most ``chunk_size`` examples (so corpora of
millions of lines never sit whole in Python lists), ``read(split)`` is those chunks concatenated, and
``fingerprint(split)`` is a cache key computed without holding the split either.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import MISSING, dataclass, fields
from itertools import islice
from pathlib import Path
from typing import TypeVar

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


CHUNK_SIZE = 20_000  # examples per chunk: big enough to amortize per-chunk work, small enough to never matter
_BLOCK = 1 << 20  # bytes read (and hashed) at a time


def check_chunk_size(chunk_size: int) -> int:
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
        raise SeqmixError(f"chunk_size must be a positive integer, got {chunk_size!r}; pass e.g. chunk_size=20000")
    return chunk_size


def chunked(items: Iterable, chunk_size: int) -> Iterator[list]:
    """Consecutive lists of at most ``chunk_size`` items, so no caller ever holds a whole split."""
    it = iter(items)
    while batch := list(islice(it, check_chunk_size(chunk_size))):
        yield batch


C = TypeVar("C")


def concat_chunks(cls: type[C], chunks: Iterable[C]) -> C:
    """One corpus from its chunks: how every ``read`` is built on ``iter_chunks``, so there is one reader.

    A field that is ``None`` in the first chunk (e.g. ``references``) stays ``None``; no chunks gives an empty
    corpus with the optional fields at their defaults.
    """
    merged = None
    for chunk in chunks:
        if merged is None:
            merged = {f.name: None if (v := getattr(chunk, f.name)) is None else list(v) for f in fields(cls)}
        else:
            for name, values in merged.items():
                if values is not None:
                    values.extend(getattr(chunk, name))
    if merged is None:
        merged = {f.name: [] for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    return cls(**merged)


def hash_chunks(chunks: Iterable, *tags) -> str:
    """sha256 of a corpus streamed chunk by chunk, for sources with no cheaper key (the chunking is part of the
    key, so always pass the same chunk size)."""
    h = hashlib.sha256(json.dumps(tags).encode())
    for chunk in chunks:
        for f in fields(chunk):
            h.update(f"\0{f.name}\0".encode())
            h.update(json.dumps(getattr(chunk, f.name), ensure_ascii=False).encode("utf-8"))
    return h.hexdigest()


def _is_gz(path: Path) -> bool:
    return path.name.endswith(".gz")


def _blocks(path: Path, decompress: bool) -> Iterator[bytes]:
    """The file's bytes (decompressed for ``.gz`` when asked) in 1 MiB blocks; a corrupt gzip becomes one
    ``SeqmixError`` naming the file, whenever it is noticed (a bad checksum only at the end)."""
    gz = decompress and _is_gz(path)
    with open(path, "rb") as raw:
        stream = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
        while True:
            try:
                block = stream.read(_BLOCK)
            except (OSError, EOFError, zlib.error) as e:
                if not gz:
                    raise
                raise SeqmixError(f"{path} is not a valid gzip file ({e}); re-create or decompress it") from e
            if not block:
                return
            yield block


def hash_file(path: Path, h=None):
    """sha256 of the file's bytes (as stored, not decompressed), hashed block by block."""
    h = hashlib.sha256() if h is None else h
    for block in _blocks(path, decompress=False):
        h.update(block)
    return h


def _decode(data: bytes | bytearray, path: Path, lines_before: int, offset: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = lines_before + data.count(b"\n", 0, e.start) + 1
        raise SeqmixError(f"{path} line {line} is not UTF-8 (bad byte at offset {offset + e.start}); convert the "
                          f"file to UTF-8") from e


def _strip_cr(lines: list[str]) -> list[str]:
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def iter_lines(path: Path) -> Iterator[str]:
    """A plain or gzipped UTF-8 file's lines, streamed in 1 MiB blocks (decoded a block at a time, which is
    much faster than per line and safe because LF never occurs inside a UTF-8 sequence).

    Split on LF only and drop one trailing CR per line, so every other whitespace (NBSP, U+2028, a lone CR inside
    a line) survives as the data ships; a last line without LF counts.
    """
    pending, lines_before, offset = bytearray(), 0, 0
    for block in _blocks(path, decompress=True):
        search_from = len(pending)
        pending += block
        cut = pending.rfind(b"\n", search_from) + 1
        if not cut:
            continue
        text = _decode(pending[:cut], path, lines_before, offset)
        offset += cut
        del pending[:cut]
        lines = text.split("\n")
        lines.pop()  # the empty string after the block's last LF
        if "\r" in text:
            lines = _strip_cr(lines)
        lines_before += len(lines)
        yield from lines
    if pending:
        yield _strip_cr([_decode(pending, path, lines_before, offset)])[0]


def require_lines(lines: Iterable[str], path: Path, unit: str = "one sentence per line") -> Iterator[str]:
    """``lines``, raising at the end if there were none: an empty file is a mistake, not an empty split."""
    empty = True
    for line in lines:
        empty = False
        yield line
    if empty:
        raise SeqmixError(f"{path} is empty; it must hold {unit}")


class DataNotFound(SeqmixError):
    """A local source's folder, or a split file in it, is missing: ``folder`` and the file ``name`` it looked for
    (the commands add how to download a task's corpus, seqmix.config.download)."""

    def __init__(self, message: str, folder: Path, name: str) -> None:
        super().__init__(message)
        self.folder, self.name = Path(folder), name

    def __reduce__(self):
        return type(self), (str(self), self.folder, self.name)


def find_split_file(directory: Path, split: str, name: str, pattern: str) -> Path:
    """``directory/name`` or ``name.gz`` (plain preferred), else an error listing what is there."""
    if not directory.is_dir():
        raise DataNotFound(f"data directory {str(directory)!r} does not exist; set task.data.source.path=<directory "
                           f"holding {name} and the other split files>", directory, name)
    for candidate in (directory / name, directory / (name + ".gz")):
        if candidate.is_file():
            return candidate
    present = sorted(p.name for p in directory.iterdir()) or ["(no files)"]
    raise DataNotFound(
        f"split {split!r} needs {name} (or {name}.gz) in {directory}, which holds: {', '.join(present)}; "
        f"fix the split name in task.data.splits or the file name pattern task.data.source.pattern={pattern!r}",
        directory, name,
    )


def remove_bpe(line: str, marker: str) -> str:
    """``line`` with subword continuations joined: every ``marker`` (e.g. subword-nmt's ``"@@ "``) removed, a
    marker's non-space part also at the end of the line (``"lau@@ fen gut@@"`` -> ``"laufen gut"``)."""
    text = (line + " ").replace(marker, "")
    return text[:-1] if text.endswith(" ") else text


def check_bpe_marker(marker: str | None) -> str | None:
    if marker is not None and (not isinstance(marker, str) or not marker.strip() or marker[-1] != " "):
        raise SeqmixError(f"remove_bpe={marker!r} must be the BPE continuation marker followed by its space, e.g. "
                          "task.data.source.remove_bpe='@@ ', or null for text without BPE")
    return marker


class LocalParallelSource:
    """Plain or gzipped line-aligned text files, e.g. ``train.en`` / ``train.de.gz``.

    ``remove_bpe``: the files are BPE-split with this continuation marker (``"@@ "`` in fairseq's prepared data such
    as prepare-iwslt14.sh's): it is removed as lines are read, so everything downstream (seqmix's own tokenizer,
    references, scoring) sees the words, never BPE on BPE."""

    def __init__(self, path: str, src_lang: str, tgt_lang: str, pattern: str = "{split}.{lang}",
                 remove_bpe: str | None = None):
        self.path = Path(os.path.expanduser(str(path)))
        self.src_lang, self.tgt_lang, self.pattern = src_lang, tgt_lang, pattern
        self.remove_bpe = check_bpe_marker(remove_bpe)

    def _require_dir(self) -> None:
        if not self.path.is_dir():
            example = self.pattern.format(split="train", lang=self.src_lang)
            raise DataNotFound(
                f"data directory {str(self.path)!r} does not exist; set task.data.source.path=<directory holding "
                f"{example} and the other split files>", self.path, example,
            )

    def file_names(self, split: str) -> list[str]:
        """The files (each plain, or gzipped with ``.gz`` added) that ``split`` reads from ``path``."""
        return [self.pattern.format(split=split, lang=lang) for lang in (self.src_lang, self.tgt_lang)]

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

    def iter_chunks(self, split: str, chunk_size: int = CHUNK_SIZE) -> Iterator[ParallelCorpus]:
        """The split's pairs, reading both files in lockstep; a line-count mismatch is raised when one side ends
        first (after the chunks before it were yielded: consumers discard partial output on any error)."""
        check_chunk_size(chunk_size)
        files = self._file(split, self.src_lang), self._file(split, self.tgt_lang)
        src_lines, tgt_lines = (require_lines(iter_lines(f), f) for f in files)
        done = 0
        while True:
            src, tgt = list(islice(src_lines, chunk_size)), list(islice(tgt_lines, chunk_size))
            if len(src) != len(tgt):
                n_src = done + len(src) + sum(1 for _ in src_lines)
                n_tgt = done + len(tgt) + sum(1 for _ in tgt_lines)
                raise SeqmixError(
                    f"{files[0]} has {n_src} lines but {files[1]} has {n_tgt}; line i of one must translate "
                    f"line i of the other, so fix the files to have equal line counts"
                )
            if not src:
                return
            done += len(src)
            if self.remove_bpe:
                src, tgt = ([remove_bpe(line, self.remove_bpe) for line in side] for side in (src, tgt))
            yield ParallelCorpus(src, tgt)

    def read(self, split: str) -> ParallelCorpus:
        return concat_chunks(ParallelCorpus, self.iter_chunks(split))

    def fingerprint(self, split: str) -> str:
        """sha256 of the two files' bytes (and of ``remove_bpe`` when set): cheaper than hashing decoded text, and
        enough to key caches."""
        h = hashlib.sha256()
        if self.remove_bpe:
            h.update(f"remove_bpe\0{self.remove_bpe}\0".encode())
        for lang in (self.src_lang, self.tgt_lang):
            h.update(f"{lang}\0".encode())
            hash_file(self._file(split, lang), h)
        return h.hexdigest()


class HFParallelSource:
    """A Hugging Face ``datasets`` dataset (hub name, local data files, or a ``save_to_disk`` directory).

    ``streaming=True`` reads the hub files (or data files) as a stream, chunk by chunk, instead of first converting
    the whole corpus into an Arrow copy under ``cache_dir``: disk holds only the token stores, memory one chunk.
    The streamed rows are the rows the Arrow copy would hold, in the same order, and the fingerprint is the one
    ``datasets`` gives that copy (it names the dataset revision and data files, not how they are read), so both
    ways share one cache of tokenizers and token stores.
    """

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
        streaming: bool = False,
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
        if streaming and self.load_from_disk:
            raise SeqmixError(
                "task.data.source.streaming=true reads a dataset from the hub or data_files without copying it, but "
                "task.data.source.load_from_disk names a saved copy: set load_from_disk=null to stream, or "
                "streaming=false to read the saved folder"
            )
        self.streaming = bool(streaming)
        self._splits = None  # DatasetDict (IterableDatasetDict when streaming), loaded once on first read
        self._builder = None  # the streaming dataset's builder: its fingerprint is the Arrow copy's

    def _describe(self) -> str:
        if self.load_from_disk:
            return f"the dataset saved at {self.load_from_disk}"
        return f"Hugging Face dataset {self.name!r}" + (f" (config {self.config!r})" if self.config else "")

    def _load(self):
        """Load every split at once so a wrong split name can be answered with the list of real ones."""
        if self._splits is not None:
            return self._splits
        import datasets

        if self.load_from_disk:
            loaded = self._load_saved(datasets)
        else:
            loaded = self._load_named(datasets)
        if isinstance(loaded, datasets.Dataset):  # a bare Dataset was saved: treat it as the train split
            loaded = datasets.DatasetDict({"train": loaded})
        self._splits = loaded
        return loaded

    def _load_saved(self, datasets):
        """A local ``save_to_disk`` folder: its errors are about that folder, never the hub."""
        where = f"task.data.source.load_from_disk={self.load_from_disk}"
        if not Path(self.load_from_disk).is_dir():
            raise SeqmixError(f"{where}: that local folder does not exist; write it once with datasets' "
                              "save_to_disk (load_dataset(...).save_to_disk(<folder>)) or fix the path")
        try:
            return datasets.load_from_disk(self.load_from_disk)
        except Exception as e:  # a folder that holds no saved dataset, or a damaged one
            raise SeqmixError(f"{where}: could not load a dataset from that folder ({type(e).__name__}: {e}); it "
                              "must be a folder written by datasets' save_to_disk") from e

    def _load_named(self, datasets):
        try:
            if self.streaming:  # what load_dataset(..., streaming=True) does, keeping the builder
                self._builder = datasets.load_dataset_builder(
                    self.name, self.config, data_files=self.data_files, cache_dir=self.cache_dir,
                    revision=self.revision,
                )
                return self._builder.as_streaming_dataset()
            return datasets.load_dataset(
                self.name, self.config, data_files=self.data_files, cache_dir=self.cache_dir, revision=self.revision,
            )
        except Exception as e:  # the library raises many types (ConnectionError, FileNotFoundError, ValueError...)
            raise SeqmixError(
                f"could not load {self._describe()}: {type(e).__name__}: {e}. The hub may be unreachable "
                f"(offline) or the name/config may be wrong; download it once elsewhere and set "
                f"task.data.source.load_from_disk=<directory written by save_to_disk>, or point task.data.source.data_files "
                f"at local json/csv/parquet files (HF_DATASETS_OFFLINE=1 skips the network retries)"
            ) from e

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

    def _text_column(self, ds, lang: str) -> tuple[str, Callable]:
        """The Arrow column holding ``lang`` and how to get its texts out of a batch, from ``{field: {lang: ...}}``
        records or a flat ``lang`` column; checked on the schema, so errors come before any text is read."""
        import pyarrow as pa
        import pyarrow.compute as pc

        schema = self.arrow_schema(ds)
        if self.field in schema.names:
            kind = schema.field(self.field).type
            found = [kind.field(i).name for i in range(kind.num_fields)] if pa.types.is_struct(kind) else [self.field]
            if lang not in found:
                raise SeqmixError(
                    f"{self._describe()} records have no language {lang!r} under {self.field!r} "
                    f"(found {found}); fix task.src_lang / task.tgt_lang"
                )
            return self.field, lambda batch: pc.struct_field(batch.column(self.field), lang).to_pylist()
        if lang in schema.names:
            return lang, self.flat_column(lang)
        raise SeqmixError(
            f"{self._describe()} has neither a {self.field!r} column nor a {lang!r} column (columns: "
            f"{schema.names}); set task.data.source.field to the column holding {{lang: text}} records, or fix the "
            f"language codes"
        )

    @staticmethod
    def arrow_schema(ds):
        """The split's Arrow schema: from its features, or (a stream whose builder declares none) from its first
        row, so a wrong column is still answered before any chunk is read."""
        import pyarrow as pa

        if ds.features is not None:
            return ds.features.arrow_schema
        first = next(iter(ds.with_format("arrow").iter(batch_size=1)), None)
        return first.schema if first is not None else pa.schema([])

    @staticmethod
    def flat_column(name: str) -> Callable:
        return lambda batch: batch.column(name).to_pylist()

    @staticmethod
    def _batches(ds, columns: list[str], chunk_size: int) -> Iterator:
        """Arrow tables of at most ``chunk_size`` rows holding only ``columns``: never a whole column in Python (a
        stream is read once, in file order, ``chunk_size`` rows at a time)."""
        check_chunk_size(chunk_size)
        return ds.select_columns(sorted(set(columns))).with_format("arrow").iter(batch_size=chunk_size)

    def _getters(self, ds) -> list[tuple[str, Callable]]:
        return [self._text_column(ds, lang) for lang in (self.src_lang, self.tgt_lang)]

    def iter_chunks(self, split: str, chunk_size: int = CHUNK_SIZE) -> Iterator[ParallelCorpus]:
        ds = self._dataset(split)
        (src_col, src), (tgt_col, tgt) = self._getters(ds)
        for batch in self._batches(ds, [src_col, tgt_col], chunk_size):
            yield ParallelCorpus(src(batch), tgt(batch))

    def read(self, split: str) -> ParallelCorpus:
        return concat_chunks(ParallelCorpus, self.iter_chunks(split))

    def _read_key(self) -> list:
        """What this class reads from a dataset, so two ways of reading one dataset get different keys."""
        return [self.field, self.src_lang, self.tgt_lang]

    def _own_fingerprint(self, split: str, ds) -> str | None:
        """``datasets``' fingerprint of the split's Arrow data; a stream has none, so it is asked of the builder,
        which gives the one the Arrow copy of the same revision and data files gets (no text is read)."""
        if self._builder is None:
            return getattr(ds, "_fingerprint", None)
        of_builder = getattr(self._builder, "_get_dataset_fingerprint", None)  # private in datasets: may go away
        return of_builder(self.split_names.get(split, split)) if callable(of_builder) else None

    def fingerprint(self, split: str) -> str:
        """The dataset's own fingerprint (``datasets`` derives it from the data files or the saved state) with what
        is read from it: instant, where hashing the text would read it all. Without one: a streamed text hash."""
        ds = self._dataset(split)
        self._getters(ds)  # a wrong field or language fails here, before a cache is keyed on it
        key = [type(self).__name__, *self._read_key()]
        own = self._own_fingerprint(split, ds)
        if own:
            return hashlib.sha256(json.dumps([*key, own]).encode()).hexdigest()
        return hash_chunks(self.iter_chunks(split), *key)


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

    def iter_chunks(self, split: str, chunk_size: int = CHUNK_SIZE) -> Iterator[ParallelCorpus]:
        """The split generated chunk by chunk from one generator, so the chunks concatenate to ``read``."""
        check_chunk_size(chunk_size)
        if split not in self.sizes:
            raise SeqmixError(f"ToyReverseSource has splits {list(SPLITS)}, not {split!r}; fix task.data.splits")
        # (seed, split index) seeds an independent stream per split, so splits never share a generator.
        rng = np.random.default_rng([self.seed, SPLITS.index(split)])
        for start in range(0, self.sizes[split], chunk_size):
            src, tgt = [], []
            for _ in range(min(chunk_size, self.sizes[split] - start)):
                n = int(rng.integers(self.min_len, self.max_len + 1))
                words = [self.words[j] for j in rng.integers(0, len(self.words), size=n)]
                src.append(" ".join(words))
                tgt.append(" ".join(reversed(words)))
            yield ParallelCorpus(src, tgt)

    def read(self, split: str) -> ParallelCorpus:
        return concat_chunks(ParallelCorpus, self.iter_chunks(split))

    def fingerprint(self, split: str) -> str:
        """A hash of the generated text (not of the settings), so a change in how it is generated is noticed."""
        return hash_chunks(self.iter_chunks(split), type(self).__name__, split)
