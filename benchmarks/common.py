"""What the sections share: device and environment, timing, a fresh process per measurement, ratios against a
baseline row of the same run, and the outputs (a rich table, a CSV). Rows are dicts: their keys are the CSV columns."""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from seqmix.config.resolvers import data_dir
from seqmix.training.provenance import cpu_model

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(data_dir())  # where train.py reads the corpora (paths.data_dir)
RESULT = "SEQMIX_BENCH_RESULT "


def environment(device: torch.device) -> dict:
    """Stored next to the numbers, so that two result folders can be compared honestly."""
    try:
        from triton import __version__ as triton
    except ImportError:  # CPU-only boxes may lack it
        triton = None
    return {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else
            cpu_model(), "torch": torch.__version__, "triton": triton, "cuda": torch.version.cuda,
            "python": platform.python_version(), "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "loadavg_1min": round(os.getloadavg()[0], 2)}


def proc_status_kb() -> dict[str, int]:
    """This process's memory counters (VmRSS, VmHWM, RssAnon, RssFile, ...) from /proc/self/status, in kB."""
    pairs = (line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {k: int(v.split()[0]) for k, v in pairs if v.strip().endswith("kB")}


def time_ms(fn: Callable, repeats: int, warmup: int, device: torch.device) -> list[float]:
    """ms per call: CPU, ``repeats`` calls after ``warmup`` (torch.utils.benchmark.Timer); CUDA, triton's do_bench."""
    if device.type == "cuda":
        from triton.testing import do_bench

        return list(do_bench(fn, return_mode="all"))
    from torch.utils.benchmark import Timer

    for _ in range(warmup):
        fn()
    timer = Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())  # its default is 1 thread
    return [timer.timeit(1).median * 1e3 for _ in range(max(1, repeats))]


def spawn(target: str, spec: dict, env: dict | None = None) -> subprocess.Popen:
    """``target`` ("module:function") called with ``spec`` in a fresh interpreter, output to files (a pipe can fill)."""
    module, func = target.split(":")
    code = f"import json, sys; from {module} import {func}; {func}(json.loads(sys.argv[1]))"
    files = [tempfile.TemporaryFile("w+") for _ in range(2)]
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(spec)], cwd=REPO_ROOT, env=env, stdout=files[0],
                            stderr=files[1], text=True)
    proc.files = files
    return proc


def child_result(proc: subprocess.Popen, timeout: float | None = None) -> dict:
    """What the child passed to :func:`report`; RuntimeError with its last stderr line when it failed."""
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = f"killed after {timeout:.0f}s"
    out, err = (f.seek(0) or f.read() for f in proc.files)
    lines = [line for line in out.splitlines() if line.startswith(RESULT)]
    if code or not lines:
        raise RuntimeError(f"exit {code}: {(err.strip().splitlines() or ['no result'])[-1][:300]}")
    return json.loads(lines[-1][len(RESULT):])


def report(result: dict) -> None:
    print(RESULT + json.dumps(result), flush=True)  # the child's side of child_result


def error_status(err: BaseException, limit: int = 300) -> str:
    """A row's status for a step that raised: its type and message on one line."""
    return f"ERROR: {type(err).__name__}: {' '.join(str(err).split())[:limit]}"


def compose_train(overrides) -> object:
    """train.yaml composed with ``overrides`` as a benchmark runs it (no logger, output folder pinned)."""
    from hydra import compose, initialize_config_dir

    from seqmix.config.resolvers import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "conf"), version_base="1.3"):
        return compose("train", ["logger=none", f"paths.output_dir={REPO_ROOT / 'outputs' / 'bench'}", *overrides])


def new_row(columns: str, **values) -> dict:
    """A result row: every one of ``columns`` (space-separated, in CSV order), None unless given."""
    return dict.fromkeys(columns.split()) | values


def ok(row: dict) -> bool:
    return row.get("status", "ok") == "ok"


def add_ratios(rows: list[dict], same: Callable, is_base: Callable, **ratios: str | Callable) -> None:
    """``row[name] = value(row) / value(base)`` for every ``name=value`` (a column or a function of the row); the
    base is the first good row with ``is_base(row)`` and the same ``same(row)``: None without one."""
    base: dict = {}
    for r in rows:
        if ok(r) and is_base(r):
            base.setdefault(same(r), r)
    for r in rows:
        b = base.get(same(r)) if ok(r) else None
        for name, value in ratios.items():
            get = value if callable(value) else (lambda x, key=value: x[key])
            num, den = get(r), b and get(b)
            r[name] = num / den if num is not None and den else None


def cell(value, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def print_table(title: str, rows: list[dict], columns: list[tuple[str, Callable | str, str]]) -> None:
    """A rich table: one line per row; ``columns``: (header, key or function of the row, format spec)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_edge=False)
    for k, (header, _, _) in enumerate(columns):
        table.add_column(header, justify="left" if k == 0 or header == "status" else "right")
    for r in rows:
        table.add_row(*(cell(get(r) if callable(get) else r[get], spec) for _, get, spec in columns))
    Console(width=None if sys.stdout.isatty() else 250).print(table)


def write_csv(path: Path, rows: list[dict]) -> list[dict]:
    """The rows as CSV; returned as they are (for results.json)."""
    if rows:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    return rows
