"""Writing a file so that readers see the old content or the whole new one, never a half-written file."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: Path, write: Callable[[BinaryIO], None]) -> None:
    """``write`` into a temp file beside ``path``, flush it to disk, then rename it over ``path``: a crash, a kill,
    a full disk or a concurrent writer never leaves a partial file under the final name (the temp file is
    removed when the write fails)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # what open() would give, not mkstemp's private 0600
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """``atomic_write`` of UTF-8 text."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
