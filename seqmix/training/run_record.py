"""A run's record, ``run.json`` in its folder: status (running → finished | failed), the overrides it was started
with, the machine and seqmix commit (``seqmix.training.provenance``), at the end its score, parameter count,
updates, tokens/s and wall time, and every scored decode of its checkpoints (``evaluations``: the final evaluation and
each ``generate.py split=...`` run on them). ``python -m seqmix.report`` turns the records of a sweep's jobs into a
table and ``python -m seqmix.report results`` the recipes' records into the README's results tables; a job that died leaves ``running`` behind and is reported as unfinished,
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


def start_record(run_dir: str | Path | None, overrides: list[str], tags: list[str], **run) -> None:
    """A started run: its overrides and tags, what ``run`` says of it (model, task, precision), machine and commit."""
    from seqmix.training.provenance import machine, source_commit

    update_record(run_dir, status="running", started=time.time(), overrides=list(overrides), tags=list(tags),
                  error=None, machine=machine(), commit=source_commit(), **run)


def record_evaluation(run_dir: str | Path | None, split: str, decoding: str, checkpoint: str,
                      metrics: dict[str, float], details: list[str] = (), options_given: list[str] = ()) -> bool:
    """Add one scored decode to ``run_dir``'s ``evaluations`` (replacing an earlier one of the same split, decoding
    settings and checkpoint): its metrics and detail lines (the metrics' signatures), the commit and machine that
    decoded, and the decoding options the command line set (none: the task's own decoding, which the results tables
    show; a probe such as ``length_beam=9`` never fills that column). False when ``run_dir`` holds no record (not a
    training run's folder): nothing is written."""
    from seqmix.training.provenance import machine, source_commit

    record = read_record(run_dir) if run_dir is not None else None
    if record is None:
        return False
    entry = {"split": split, "decoding": decoding, "checkpoint": checkpoint, "metrics": dict(metrics),
             "details": list(details), "options_given": sorted(options_given), "commit": source_commit(),
             "machine": machine(), "when": time.time()}
    same = (split, decoding, checkpoint)
    kept = [e for e in record.get("evaluations") or []
            if isinstance(e, dict) and (e.get("split"), e.get("decoding"), e.get("checkpoint")) != same]
    update_record(run_dir, evaluations=[*kept, entry])
    return True


def finish_record(run_dir: str | Path | None, **results) -> None:
    record = read_record(run_dir) if run_dir is not None else None
    started = (record or {}).get("started")
    wall = None if started is None else round(time.time() - started, 1)
    update_record(run_dir, status="finished", wall_seconds=wall, **results)


def fail_record(run_dir: str | Path | None, message: str) -> None:
    """Mark a started run failed (a folder without a record is not a training run's: left alone)."""
    if run_dir is not None and read_record(run_dir) is not None:
        update_record(run_dir, status="failed", error=message)
