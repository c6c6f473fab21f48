"""Variable-length rows over one flat array (row i = ``flat[offsets[i]:offsets[i+1]]``).

The same container serves small in-memory data (``from_rows``) and memory-mapped token stores: datasets index it
without caring which. Mapped arrays pickle as their file names, so a DataLoader worker or a spawned process
re-opens the map instead of receiving a copy of the data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np


def open_mapped(path: str, dtype, shape: tuple[int, ...], offset: int = 0) -> np.ndarray:
    """A read-only memory map (an empty array for an empty file, which mmap refuses)."""
    if int(np.prod(shape)) == 0:
        return np.zeros(shape, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def _portable(array: np.ndarray):
    """How to rebuild ``array`` in another process: its file when it is a whole mapped file, else itself."""
    if isinstance(array, np.memmap) and array.filename is not None:
        return (open_mapped, (array.filename, array.dtype.str, array.shape, array.offset))
    return None


def _rebuild(spec, value):
    return spec[0](*spec[1]) if spec is not None else value


class Ragged:
    """Rows of integers (token ids, or utf-8 bytes for texts) with their sizes, mapped or in memory."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray, sizes: np.ndarray | None = None):
        self.flat, self.offsets = flat, offsets
        self.sizes = np.diff(offsets) if sizes is None else sizes
        if len(self.sizes) != len(offsets) - 1:
            raise ValueError(f"{len(self.sizes)} sizes for {len(offsets) - 1} rows")

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[int]], dtype=np.int64) -> Ragged:
        rows = [np.asarray(r, dtype=dtype) for r in rows]
        sizes = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        flat = np.concatenate(rows) if rows else np.zeros(0, dtype=dtype)
        return cls(flat.astype(dtype, copy=False), offsets, sizes)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        if not -len(self) <= i < len(self):
            raise IndexError(f"row {i} of {len(self)}")
        i %= len(self)
        return self.flat[int(self.offsets[i]): int(self.offsets[i + 1])]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def tolist(self) -> list[list[int]]:
        """Every row as a Python list (small data and tests only)."""
        return [row.tolist() for row in self]

    def __reduce__(self):
        specs = tuple(_portable(a) for a in (self.flat, self.offsets, self.sizes))
        values = tuple(None if s is not None else a for s, a in zip(specs, (self.flat, self.offsets, self.sizes)))
        return (_rebuild_ragged, (specs, values))


def _rebuild_ragged(specs, values) -> Ragged:
    return Ragged(*(_rebuild(s, v) for s, v in zip(specs, values)))


class TextRows(Sequence):
    """Strings stored as utf-8 rows, decoded on access (the raw text of scored splits); ``parse`` turns each
    string into the value it encodes (``json.loads`` for lists of references)."""

    def __init__(self, rows: Ragged, parse: Callable[[str], object] | None = None):
        self.rows, self.parse = rows, parse

    @classmethod
    def from_strings(cls, texts: Iterable[str]) -> TextRows:
        return cls(Ragged.from_rows((np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts), np.uint8))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        text = self.rows[i].tobytes().decode("utf-8")
        return text if self.parse is None else self.parse(text)
