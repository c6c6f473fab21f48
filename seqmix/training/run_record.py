"""A run's record, ``run.json`` in its folder: status (running → finished | failed), the overrides it was started
with, and at the end its score, parameter count, updates, tokens/s and wall time. ``python -m seqmix.report`` turns
the records of a sweep's jobs into a table; a job that died leaves ``running`` behind and is reported as unfinished,
never dropped."""

from __future__ import annotations

import json
import time
from pathlib import Path

from seqmix.files import atomic_write_text

RECORD = "run.json"


def read_record(run_dir: str | Path) -> dict | None:
    """The record of ``run_dir`` (None when there is none or it does not parse)."""
    try:
        record = json.loads((Path(run_dir) / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _rank_zero() -> bool:
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    return getattr(rank_zero_only, "rank", 0) == 0


def update_record(run_dir: str | Path | None, **fields) -> None:
    """Merge ``fields`` into ``run_dir``'s record, written whole (atomically) every time, by rank 0 only."""
    if run_dir is None or not _rank_zero():
        return
    record = {**(read_record(run_dir) or {}), **fields, "updated": time.time()}
    atomic_write_text(Path(run_dir) / RECORD, json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")


def start_record(run_dir: str | Path | None, overrides: list[str], tags: list[str]) -> None:
    update_record(run_dir, status="running", started=time.time(), overrides=list(overrides), tags=list(tags),
                  error=None)


def finish_record(run_dir: str | Path | None, **results) -> None:
    record = read_record(run_dir) if run_dir is not None else None
    started = (record or {}).get("started")
    wall = None if started is None else round(time.time() - started, 1)
    update_record(run_dir, status="finished", wall_seconds=wall, **results)


def fail_record(run_dir: str | Path | None, message: str) -> None:
    """Mark a started run failed (a folder without a record is not a training run's: left alone)."""
    if run_dir is not None and read_record(run_dir) is not None:
        update_record(run_dir, status="failed", error=message)
