"""CPU decoding keeps freed memory in the heap (seqmix/generation/memory.py), measured with glibc's mallinfo2."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

PROBE = """
import ctypes, json, torch
from seqmix.generation.memory import keep_freed_memory

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
kept = keep_freed_memory()
before = libc.mallinfo2().hblkhd
x = torch.ones(16 * 2**20)  # 64 MB, above glibc's largest mmap threshold
mapped = libc.mallinfo2().hblkhd - before
del x
free_after = libc.mallinfo2().fordblks
print(json.dumps({"kept": kept, "mapped": mapped, "free_after": free_after}))
"""


def probe(**env) -> dict:
    environ = {k: v for k, v in os.environ.items() if k != "SEQMIX_KEEP_FREED_MEMORY"} | env
    out = subprocess.run([sys.executable, "-c", PROBE], env=environ, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.system() != "Linux" or not platform.libc_ver()[0] == "glibc", reason="glibc only")
def test_a_freed_large_block_stays_in_the_heap_and_can_be_turned_off():
    kept = probe()
    assert kept["kept"] is True
    assert kept["mapped"] < 2**20  # the 64 MB block came from the heap, not from mmap
    assert kept["free_after"] >= 64 * 2**20  # and stayed there once freed
    default = probe(SEQMIX_KEEP_FREED_MEMORY="0")
    assert default["kept"] is False
    assert default["mapped"] >= 64 * 2**20  # glibc's default: mapped, and unmapped when freed
    assert default["free_after"] < 64 * 2**20
