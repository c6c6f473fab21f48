"""Binarized, memory-mapped token stores: one directory per encoded split, shared by every rank and worker.

A store holds named fields of rows. A ``tokens`` field is a flat array of ids (uint16 when the vocabulary fits,
else int32), int64 offsets and a compact sizes array; a ``text`` field holds utf-8 rows (raw text, kept only for
splits that are scored). ``header.json`` records the format version, the vocabulary hash, the counts and, per file,
its byte size and CRC-32.

Readers memory-map the files: start-up costs milliseconds, resident memory does not grow with the corpus, and the
OS page cache holds one copy for all processes. Writers build into a hidden temporary directory and rename it into
place only when every file and the header are on disk, so a killed build never leaves something that looks
finished; ``open_or_build`` serializes builders with a file lock (one builds, the others wait and then read).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from seqmix.data.ragged import Ragged, TextRows, open_mapped
from seqmix.errors import SeqmixError

log = logging.getLogger(__name__)

FORMAT, VERSION = "seqmix-token-store", 1
HEADER = "header.json"
KINDS = ("tokens", "text")
_CRC_BLOCK = 1 << 22


class StoreMissing(SeqmixError):
    """No finished store at the path (never built, or a build that did not finish)."""


class StoreInvalid(SeqmixError):
    """A store that exists but must not be read: truncated, corrupted, foreign format or another vocabulary."""


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


def _sizes_dtype(max_size: int) -> np.dtype:
    return np.dtype(np.uint16) if max_size <= np.iinfo(np.uint16).max else np.dtype(np.int32)


def file_crc32(path: Path) -> int:
    """CRC-32 of a file read in blocks into one buffer (flat memory, however large the file)."""
    crc, buf = 0, bytearray(_CRC_BLOCK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
    return crc


class _FieldWriter:
    """Appends one field's values; offsets and sizes are written when the store is committed."""

    def __init__(self, directory: Path, name: str, kind: str, dtype: np.dtype, head: np.ndarray):
        self.name, self.kind, self.dtype, self.directory = name, kind, dtype, directory
        self.values = open(directory / f"{name}.values.bin", "wb")
        self.sizes = open(directory / f"{name}.sizes.tmp", "wb")
        self.crc, self.count, self.rows, self.max_value, self.head = 0, 0, 0, -1, len(head)
        if len(head):
            self._write_values(np.asarray(head))

    def _write_values(self, flat: np.ndarray) -> None:
        if len(flat) == 0:
            return
        data = np.ascontiguousarray(flat, dtype=self.dtype)
        self.max_value = max(self.max_value, int(data.max()))
        self.crc = zlib.crc32(memoryview(data).cast("B"), self.crc)
        self.values.write(data.tobytes())
        self.count += len(data)

    def append(self, flat: np.ndarray, sizes: np.ndarray) -> None:
        sizes = np.asarray(sizes, dtype=np.int64)
        if int(sizes.sum()) != len(flat):
            raise ValueError(f"field {self.name}: sizes add up to {int(sizes.sum())}, not {len(flat)}")
        self._write_values(flat)
        self.sizes.write(sizes.tobytes())
        self.rows += len(sizes)

    def finish(self) -> dict:
        """Write offsets and compact sizes; return this field's header entry."""
        for f in (self.values, self.sizes):
            f.flush()
            os.fsync(f.fileno())
            f.close()
        tmp = self.directory / f"{self.name}.sizes.tmp"
        sizes = np.fromfile(tmp, dtype=np.int64)
        tmp.unlink()
        offsets = np.empty(len(sizes) + 1, dtype=np.int64)
        offsets[0] = self.head
        np.cumsum(sizes, out=offsets[1:])
        offsets[1:] += self.head
        max_size = int(sizes.max()) if len(sizes) else 0
        compact = sizes.astype(_sizes_dtype(max_size))
        files = {f"{self.name}.values.bin": self.crc}
        for suffix, array in (("offsets", offsets), ("sizes", compact)):
            path = self.directory / f"{self.name}.{suffix}.bin"
            with open(path, "wb") as f:
                f.write(array.tobytes())
                f.flush()
                os.fsync(f.fileno())
            files[path.name] = zlib.crc32(array.tobytes())
        return {"kind": self.kind, "dtype": self.dtype.str, "sizes_dtype": compact.dtype.str, "rows": self.rows,
                "values": self.count, "head": self.head, "max_size": max_size, "max_value": self.max_value,
                "files": files}


class StoreWriter:
    """Builds a store in a hidden temporary directory beside ``path``; ``commit`` renames it into place.

    Used as a context manager: leaving it by an exception (or without commit) deletes the temporary directory.
    """

    def __init__(self, path: Path, vocab_hash: str, vocab_size: int, meta: dict | None = None):
        self.path = Path(path)
        self.vocab_hash, self.vocab_size, self.meta = vocab_hash, int(vocab_size), dict(meta or {})
        self.tmp = self.path.parent / f".{self.path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp"
        self.fields: dict[str, _FieldWriter] = {}
        self.committed = False

    def __enter__(self) -> StoreWriter:
        self.tmp.mkdir(parents=True)
        return self

    def __exit__(self, *exc) -> None:
        for field in self.fields.values():
            for f in (field.values, field.sizes):
                f.close()
        if not self.committed:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def add_field(self, name: str, kind: str = "tokens", head: tuple[int, ...] = ()) -> None:
        """``head``: values stored before row 0 (a language-modeling stream's leading ``</s>``)."""
        if kind not in KINDS:
            raise ValueError(f"field kind {kind!r} is not one of {KINDS}")
        dtype = token_dtype(self.vocab_size) if kind == "tokens" else np.dtype(np.uint8)
        self.fields[name] = _FieldWriter(self.tmp, name, kind, dtype, np.asarray(head, dtype=np.int64))

    def append(self, name: str, flat: np.ndarray, sizes: np.ndarray) -> None:
        field = self.fields[name]
        if field.kind == "tokens" and len(flat) and (int(flat.max()) >= self.vocab_size or int(flat.min()) < 0):
            raise ValueError(f"field {name}: token ids outside the vocabulary of {self.vocab_size}")
        field.append(flat, sizes)

    def append_texts(self, name: str, texts: list[str]) -> None:
        encoded = [t.encode("utf-8") for t in texts]
        flat = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        self.fields[name].append(flat, np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))

    def commit(self, meta: dict | None = None) -> Path:
        """Finish every file, write the header last, then rename the directory into place (atomic)."""
        entries = {name: field.finish() for name, field in self.fields.items()}
        rows = {e["rows"] for e in entries.values()}
        if len(rows) > 1:
            raise ValueError(f"fields have different row counts: { {n: e['rows'] for n, e in entries.items()} }")
        files = {}
        for entry in entries.values():
            for fname, crc in entry.pop("files").items():
                files[fname] = {"bytes": (self.tmp / fname).stat().st_size, "crc32": crc}
        header = {"format": FORMAT, "version": VERSION, "vocab_hash": self.vocab_hash, "vocab_size": self.vocab_size,
                  "rows": rows.pop() if rows else 0, "fields": entries, "files": files,
                  "meta": {**self.meta, **(meta or {})}, "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        with open(self.tmp / HEADER, "w", encoding="utf-8") as f:
            json.dump(header, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(self.tmp)
        try:
            os.rename(self.tmp, self.path)
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            log.info("%s was finished by another process; keeping that one", self.path)
            return self.path  # __exit__ removes ours
        self.committed = True
        _fsync_dir(self.path.parent)
        return self.path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TokenStore:
    """A finished store, memory-mapped. ``tokens(name)`` / ``texts(name)`` give a field's rows."""

    def __init__(self, path: Path, header: dict):
        self.path, self.header = Path(path), header

    def __len__(self) -> int:
        return int(self.header["rows"])

    @property
    def meta(self) -> dict:
        return self.header["meta"]

    @property
    def fields(self) -> dict:
        return self.header["fields"]

    def _ragged(self, name: str) -> Ragged:
        if name not in self.fields:
            raise SeqmixError(f"the token store {self.path} has no field {name!r} (it has {sorted(self.fields)})")
        entry, n = self.fields[name], len(self)
        base = str(self.path / name)
        return Ragged(open_mapped(f"{base}.values.bin", np.dtype(entry["dtype"]), (entry["values"],)),
                      open_mapped(f"{base}.offsets.bin", np.dtype(np.int64), (n + 1,)),
                      open_mapped(f"{base}.sizes.bin", np.dtype(entry["sizes_dtype"]), (n,)))

    def tokens(self, name: str) -> Ragged:
        return self._ragged(name)

    def texts(self, name: str, parse: Callable[[str], object] | None = None) -> TextRows:
        return TextRows(self._ragged(name), parse)

    def has(self, name: str) -> bool:
        return name in self.fields


def read_header(path: Path) -> dict:
    """The header of a finished store, or StoreMissing / StoreInvalid saying why it cannot be used."""
    path = Path(path)
    if not (path / HEADER).is_file():
        raise StoreMissing(f"no token store at {path}")
    try:
        header = json.loads((path / HEADER).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StoreInvalid(f"unreadable header ({e})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise StoreInvalid("not a seqmix token store")
    if header.get("version") != VERSION:
        raise StoreInvalid(f"format version {header.get('version')}, this seqmix reads version {VERSION}")
    return header


def open_store(path: Path, vocab_hash: str | None = None, verify: bool = True) -> TokenStore:
    """Open a finished store; raise StoreMissing / StoreInvalid instead of ever returning bad data.

    Every file must have its recorded size (a cut file fails here), and with ``verify`` its CRC-32 (flipped bytes
    fail here; it reads each file once, which also warms the page cache that training reads next).
    """
    path = Path(path)
    header = read_header(path)
    if vocab_hash is not None and header.get("vocab_hash") != vocab_hash:
        raise StoreInvalid("it was encoded with another vocabulary (vocabulary hash differs)")
    try:
        for name, entry in header["files"].items():
            f = path / name
            if not f.is_file():
                raise StoreInvalid(f"{name} is missing")
            size = f.stat().st_size
            if size != entry["bytes"]:
                raise StoreInvalid(f"{name} has {size} bytes, the header says {entry['bytes']} (cut or overwritten)")
            if verify and file_crc32(f) != entry["crc32"]:
                raise StoreInvalid(f"{name} does not match its checksum (corrupted)")
        store = TokenStore(path, header)
        for name, entry in store.fields.items():
            offsets = store.tokens(name).offsets
            if len(offsets) and (int(offsets[0]) != entry["head"] or int(offsets[-1]) != entry["values"]):
                raise StoreInvalid(f"{name} offsets do not span its {entry['values']} values")
    except (KeyError, TypeError, ValueError) as e:
        raise StoreInvalid(f"malformed header ({type(e).__name__}: {e})") from None
    return store


@contextlib.contextmanager
def exclusive(lock_path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (released by the kernel even if the process is killed)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process that is building %s", what)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _discard(path: Path, reason: str) -> None:
    """Move an unusable store out of the way, then delete it (a reader that has it open keeps its files)."""
    log.warning("token store %s is unusable (%s); rebuilding it", path, reason)
    aside = path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.discarded"
    os.rename(path, aside)
    shutil.rmtree(aside, ignore_errors=True)


def _remove_stale_builds(path: Path) -> None:
    """Temporary directories of builds that died (we hold the lock, so no build of this store is running)."""
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)


def open_or_build(path: Path, vocab_hash: str, vocab_size: int, build: Callable[[StoreWriter], dict | None],
                  verify: bool = True) -> tuple[TokenStore, bool]:
    """(store, built): open the store at ``path`` or build it once with ``build(writer)`` (which adds fields and
    appends rows, and may return metadata for the header). Concurrent callers wait for one builder; a corrupted or
    stale store is rebuilt."""
    path = Path(path)
    try:
        return open_store(path, vocab_hash, verify), False
    except StoreMissing:
        pass
    except StoreInvalid:
        pass  # examined again under the lock: another process may be replacing it right now
    with exclusive(path.parent / f"{path.name}.lock", str(path)):
        try:
            return open_store(path, vocab_hash, verify), False
        except StoreMissing:
            pass
        except StoreInvalid as e:
            _discard(path, str(e))
        _remove_stale_builds(path)
        try:
            with StoreWriter(path, vocab_hash, vocab_size) as writer:
                meta = build(writer)
                writer.commit(meta)
        except OSError as e:
            raise SeqmixError(f"cannot write the token store {path} ({e.strerror or e}); free disk space or set "
                              "task.data.cache_dir to a writable directory with room") from e
        return open_store(path, vocab_hash, verify=False), True
