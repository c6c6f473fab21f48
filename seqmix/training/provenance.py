"""Where a number came from: the machine (CPU model and generation, the instruction sets that change its speed,
threads, GPU) and the seqmix source (git commit, marked when tracked files differ from it). Written into run records so
that a results table says on what and with which code each row was measured; never raises (unknown parts read
"unknown")."""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch

# the CPU features that decide seqmix's CPU speed and precision (AVX-512, native bf16 matmuls)
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def cpu_model(info: dict[str, str] | None = None) -> str:
    """The CPU's model name (``platform.processor()`` where /proc/cpuinfo has none)."""
    info = _cpuinfo() if info is None else info
    return info.get("model name") or platform.processor() or "unknown"


def cpu_generation(info: dict[str, str] | None = None) -> str | None:
    """``family 26 model 2``: what tells apart CPUs whose model name a virtual machine shortens (``AMD EPYC`` is Zen 3,
    4 or 5); None where /proc/cpuinfo does not say."""
    info = _cpuinfo() if info is None else info
    family, model = info.get("cpu family"), info.get("model")
    return f"family {family} model {model}" if family and model else None


def machine() -> dict:
    """``cpu`` (model name), ``cpu_generation`` (family and model numbers), ``cpu_flags`` (those of ``SPEED_FLAGS`` it
    has), ``threads`` (torch's), ``gpu`` (the first CUDA device's name, or None) and ``torch`` (version)."""
    info = _cpuinfo()
    flags = set(info.get("flags", "").split())
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu_model(info), "cpu_generation": cpu_generation(info),
            "cpu_flags": [f for f in SPEED_FLAGS if f in flags], "threads": torch.get_num_threads(), "gpu": gpu,
            "torch": torch.__version__}


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(SOURCE_ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_commit() -> str:
    """The seqmix checkout's commit (12 hex digits), ``+changes`` when tracked files differ from it; "unknown"
    outside a git checkout (an installed wheel)."""
    commit = _git("rev-parse", "--short=12", "HEAD")
    if not commit:
        return "unknown"
    changed = _git("status", "--porcelain", "--untracked-files=no")
    return commit + ("+changes" if changed else "")
