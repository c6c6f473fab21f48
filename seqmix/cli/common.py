"""Pieces shared by the train and generate entry points: error reporting and the model summary."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig
from torch import nn

from seqmix.config.runtime import in_multirun
from seqmix.config.user_errors import user_error_in
from seqmix.errors import SeqmixError
from seqmix.models import count_parameters
from seqmix.training.run_record import fail_record

_STARTED = time.time()  # when this process started (imported by the entry points first thing)


def module_summary(model: nn.Module, depth: int = 2) -> str:
    rows = []

    def walk(module: nn.Module, prefix: str, level: int) -> None:
        for name, child in module.named_children():
            full = f"{prefix}.{name}" if prefix else name
            rows.append(f"{'  ' * level}{full:<40} {type(child).__name__:<22} {count_parameters(child):>14,}")
            if level + 1 < depth:
                walk(child, full, level + 1)

    walk(model, "", 0)
    return "\n".join([f"{'module':<40} {'type':<22} {'parameters':>14}", *rows])


def output_dir_of(cfg: DictConfig) -> Path | None:
    try:
        return Path(cfg.paths.output_dir)
    except Exception:  # hydra runtime not available (direct calls in tests)
        return None


def clean_failed_run(cfg: DictConfig, message: str) -> None:
    """A failed run must not look like a valid one: drop its folder if it holds no checkpoint, else mark it FAILED.
    A folder that held files before this process started (``hydra.run.dir`` pointed at another run's) is not
    this run's to delete or mark."""
    out = output_dir_of(cfg)
    if out is None or not out.exists():
        return
    files = [p for p in out.rglob("*") if p.is_file()]
    if any(p.stat().st_mtime < _STARTED and p.parent.name != ".hydra" for p in files):
        return
    if any(p.suffix == ".ckpt" for p in files):
        (out / "FAILED").write_text(message + "\n")
    else:
        logging.shutdown()
        shutil.rmtree(out, ignore_errors=True)


def user_errors_exit(fn: Callable[[DictConfig], object]) -> Callable[[DictConfig], object]:
    """Turn a user's mistake (seqmix.cli.user_errors) into one clear line on stderr and exit status 2, removing the
    run folder it leaves (or marking it FAILED when it already holds checkpoints). In a multirun the job's folder
    stays with its record marked failed, and the error goes back to Hydra, which runs the other jobs and then ends
    the sweep with it (``python -m seqmix.report`` lists the job as failed)."""

    @functools.wraps(fn)
    def wrapper(cfg: DictConfig):
        try:
            return fn(cfg)
        except Exception as raised:
            found = user_error_in(raised)
            if in_multirun():
                fail_record(output_dir_of(cfg), found[1] if found else f"{type(raised).__name__}: {raised}")
                if found is None:
                    raise
                print(f"seqmix: error: {found[1]}", file=sys.stderr, flush=True)
                raise SeqmixError(found[1]) from None
            if found is None:
                raise
            clean_failed_run(cfg, f"seqmix: error: {found[1]}")
            report_and_exit(found[1])

    return wrapper


def report_and_exit(message: str) -> None:
    print(f"seqmix: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


def run_entry_point(main: Callable[[], object]) -> None:
    """Run a ``@hydra.main`` function so that Hydra's own errors (raised while composing the config or creating the
    run folder, before seqmix's code runs) end like every other user error. Hydra prints its errors itself unless
    HYDRA_FULL_ERROR is set; it is set here so they reach us, and a user who set it gets the full trace as before."""
    user_wants_traces = os.environ.get("HYDRA_FULL_ERROR") == "1" and "SEQMIX_HYDRA_FULL_ERROR" not in os.environ
    os.environ["HYDRA_FULL_ERROR"] = os.environ["SEQMIX_HYDRA_FULL_ERROR"] = "1"  # children (DDP ranks) too
    try:
        main()
    except Exception as raised:
        found = None if user_wants_traces else user_error_in(raised)
        if found is None:
            raise
        report_and_exit(found[1])
