"""CPU decoding keeps the memory it frees, so that its next steps reuse warm pages.

Every beam step allocates its (rows, vocabulary) logits and log-probabilities afresh, ~100 MB each for a few
thousand rows. glibc serves blocks that large (above its mmap threshold, 32 MB at most) with fresh pages from the
kernel and returns them when freed, so each step faulted and zeroed them again: that cost more than the output
projection itself (benchmarks/README.md, "Serving"). :func:`keep_freed_memory` has glibc serve every block from its
heap and keep what is freed there. It is process-wide and not undone (the process's resident memory stays at its
peak), which suits the decoding commands that call it; ``SEQMIX_KEEP_FREED_MEMORY=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_MAX = -4
_INT_MAX = 2**31 - 1
_done: bool | None = None


def keep_freed_memory() -> bool:
    """Keep freed memory in the heap from now on (once per process); False where turned off or not glibc."""
    global _done
    if _done is None:
        _done = os.environ.get("SEQMIX_KEEP_FREED_MEMORY", "1") != "0" and _mallopt_keep()
    return _done


def _mallopt_keep() -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - glibc's only: other C libraries' mallopt differs or is a stub
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # no block from mmap (so none goes back to the kernel when freed), and never trim the heap's free top
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, _INT_MAX))
