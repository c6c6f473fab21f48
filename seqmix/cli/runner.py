"""The one guarded runner of the Hydra commands (train.py, generate.py, preprocess.py).

Whatever goes wrong ends in one line on stderr: a user's mistake in ``seqmix: error: <what to do>`` and exit status 2,
anything else in ``seqmix: internal error: ...`` naming the file that holds its traceback, and exit status 1. A failed
run never looks like a valid one: its folder is removed when it holds nothing of value, else its record says failed
(and a FAILED file says why). In a multirun each failed job gets its line and its record, Hydra runs the other jobs,
and the sweep ends with one line naming every failed job.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable

from omegaconf import DictConfig

from seqmix.cli.common import output_dir_of
from seqmix.config.runtime import in_multirun, job_overrides
from seqmix.config.user_errors import (
    internal_error_line,
    report_internal_error,
    report_user_error,
    user_error_in,
    write_traceback,
)
from seqmix.errors import SeqmixError
from seqmix.training.run_record import fail_record

_STARTED = time.time()  # when this process started (imported by the entry points first thing)
_FAILED_JOBS: list[tuple[str, str, bool]] = []  # this process's failed multirun jobs: (overrides, line, user error)


def log_dir_of(cfg: DictConfig) -> str | None:
    try:
        return str(cfg.paths.log_dir)
    except Exception:  # no paths group (direct calls in tests)
        return None


def clean_failed_run(cfg: DictConfig, message: str) -> None:
    """A failed run must not look like a valid one: drop its folder if it holds no checkpoint, else mark its record
    failed and write FAILED. A folder that held files before this process started (``hydra.run.dir`` pointed at
    another run's) is not this run's to delete or mark."""
    out = output_dir_of(cfg)
    if out is None or not out.exists():
        return
    files = [p for p in out.rglob("*") if p.is_file()]
    if any(p.stat().st_mtime < _STARTED and p.parent.name != ".hydra" for p in files):
        return
    if any(p.suffix == ".ckpt" for p in files):
        fail_record(out, message)
        (out / "FAILED").write_text(message + "\n")
    else:
        logging.shutdown()
        shutil.rmtree(out, ignore_errors=True)


def _failure_line(cfg: DictConfig, raised: Exception, found: tuple | None) -> str:
    """The one line a failure ends in; for a bug, after its traceback is written to a file the line names."""
    if found is not None:
        return f"seqmix: error: {found[1]}"
    return internal_error_line(raised, write_traceback(raised, log_dir_of(cfg)))


def _job_failed(cfg: DictConfig, line: str, found: tuple | None) -> None:
    """A multirun job's failure: its line, its record, and a SeqmixError for Hydra, which goes on with the other
    jobs and raises the first failure at the end of the sweep (``run_command`` then prints the summary)."""
    fail_record(output_dir_of(cfg), line)
    overrides = " ".join(job_overrides()) or "(no overrides)"
    _FAILED_JOBS.append((overrides, line, found is not None))
    print(f"{line} [job: {overrides}]", file=sys.stderr, flush=True)
    raise SeqmixError(line) from None


def guarded_job(fn: Callable[[DictConfig], object]) -> Callable[[DictConfig], object]:
    """Wrap a ``@hydra.main`` function's body: every failure ends as the module docstring says."""

    @functools.wraps(fn)
    def wrapper(cfg: DictConfig):
        try:
            return fn(cfg)
        except Exception as raised:
            found = user_error_in(raised)
            line = _failure_line(cfg, raised, found)
            if in_multirun():
                _job_failed(cfg, line, found)
            clean_failed_run(cfg, line)
            print(line, file=sys.stderr, flush=True)
            sys.exit(2 if found is not None else 1)

    return wrapper


def run_command(main: Callable[[], object]) -> None:
    """Run a ``@hydra.main`` function so that Hydra's own errors (raised while composing the config or creating the
    run folder, before ``guarded_job`` runs) end the same way, and a multirun with failed jobs ends in one summary
    line. Hydra prints its errors itself unless HYDRA_FULL_ERROR is set; it is set here so they reach us, and a user
    who set it gets the full trace."""
    user_wants_traces = os.environ.get("HYDRA_FULL_ERROR") == "1" and "SEQMIX_HYDRA_FULL_ERROR" not in os.environ
    os.environ["HYDRA_FULL_ERROR"] = os.environ["SEQMIX_HYDRA_FULL_ERROR"] = "1"  # children (DDP ranks) too
    try:
        main()
    except Exception as raised:
        if user_wants_traces:
            raise
        if _FAILED_JOBS:
            jobs = "; ".join(f"[{overrides}]" for overrides, _, _ in _FAILED_JOBS)
            print(f"seqmix: error: {len(_FAILED_JOBS)} job(s) of the sweep failed, each said why above: {jobs}",
                  file=sys.stderr, flush=True)
            sys.exit(2 if all(user for _, _, user in _FAILED_JOBS) else 1)
        found = user_error_in(raised)
        if found is None:
            report_internal_error(raised, os.environ.get("SEQMIX_LOG_DIR"))
        report_user_error(found[1])
