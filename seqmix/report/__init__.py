"""A sweep as the table a paper prints: ``python -m seqmix.report <multirun dir> [--metric score|best_valid]``
(and the README's results tables: ``python -m seqmix.report results``, see ``seqmix.report.results``).

Every job of a Hydra multirun (its folder's ``.hydra/overrides.yaml`` and ``run.json`` record, see
``seqmix.training.run_record``) becomes a row; the overrides that vary between jobs are the row's key, and jobs that differ
only in ``seed`` are one row, mean ± std. Failed jobs, jobs that never finished and jobs the sweep planned but never
started are listed as such, never dropped. Writes ``report.md``, ``report.csv`` and ``report.png`` (score against
parameters, or against wall time when every job has the same size) into the multirun folder or ``--out``.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from seqmix.config.user_errors import CommandParser, command_status
from seqmix.errors import SeqmixError
from seqmix.files import atomic_write, atomic_write_text
from seqmix.training.run_record import read_record

SEED = "seed"


@dataclass
class Job:
    name: str  # the job's folder ("3"), or "(not started)"
    overrides: dict[str, str]
    status: str  # finished | failed | unfinished | not started
    record: dict = field(default_factory=dict)

    def value(self, key: str):
        v = self.record.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key.lstrip("+~"), value


def overrides_by_key(lines) -> dict[str, str]:
    """``key=value`` overrides as a dict, their ``+``/``~`` marks dropped."""
    return dict(_split(str(o)) for o in lines or [] if "=" in str(o))


def planned_jobs(sweep_dir: Path) -> list[dict[str, str]] | None:
    """The jobs the sweep asked for (its ``multirun.yaml``: command-line sweep overrides and
    ``hydra.sweeper.params``), expanded as Hydra's basic sweeper does; None when that cannot be worked out."""
    try:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.override_parser.overrides_parser import OverridesParser

        conf = yaml.safe_load((sweep_dir / "multirun.yaml").read_text(encoding="utf-8"))
        hydra = conf["hydra"]
        overrides = list(hydra["overrides"]["task"] or [])
        given = {_split(o)[0] for o in overrides}
        params = (hydra.get("sweeper") or {}).get("params") or {}
        overrides += [f"{k}={v}" for k, v in params.items() if k not in given]
        parsed = OverridesParser.create().parse_overrides(overrides)
        return [overrides_by_key(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception:  # no multirun.yaml, or a sweeper other than the basic one: report the folders found
        return None


def _read_overrides(path: Path) -> list:
    """A job's overrides file; a damaged one is named, not a traceback."""
    try:
        overrides = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise SeqmixError(f"{path} is damaged ({type(err).__name__}); repair it from the job's run.json overrides or "
                          "remove that job folder, then report again") from None
    if not isinstance(overrides, list):
        raise SeqmixError(f"{path} does not hold a list of overrides; repair it or remove that job folder")
    return overrides


def read_jobs(sweep_dir: Path) -> list[Job]:
    folders = sorted((p.parent.parent for p in sweep_dir.glob("*/.hydra/overrides.yaml")),
                     key=lambda p: (not p.name.isdigit(), int(p.name) if p.name.isdigit() else 0, p.name))
    jobs = []
    for folder in folders:
        overrides = overrides_by_key(_read_overrides(folder / ".hydra" / "overrides.yaml"))
        record = read_record(folder) or {}
        status = record.get("status")
        status = status if status in ("finished", "failed") else "unfinished"
        jobs.append(Job(folder.name, overrides, status, record))
    started = [j.overrides for j in jobs]
    for plan in planned_jobs(sweep_dir) or []:
        if plan not in started:
            jobs.append(Job("(not started)", plan, "not started"))
    return jobs


def varying_keys(jobs: list[Job]) -> list[str]:
    keys = sorted({k for j in jobs for k in j.overrides}, key=lambda k: min(
        list(j.overrides).index(k) for j in jobs if k in j.overrides))
    return [k for k in keys if len({j.overrides.get(k) for j in jobs}) > 1]


def _mean_std(values: list[float], digits: int) -> str:
    if not values:
        return ""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _mean(values: list[float], digits: int) -> str:
    return f"{statistics.mean(values):.{digits}f}" if values else ""


def metric_label(jobs: list[Job], metric: str) -> str:
    """The metric's column name: the final score's own name (BLEU, perplexity, ...) or the best of the validation
    metric the checkpoints were chosen by (``best val/bleu``)."""
    if metric == "best_valid":
        monitor = next((j.record.get("monitor") for j in jobs if j.record.get("monitor")), None)
        return f"best {monitor}" if monitor else metric
    if metric != "score":
        return metric
    return next((j.record.get("score_name") for j in jobs if j.record.get("score_name")), "score")


def table(jobs: list[Job], metric: str) -> tuple[list[str], list[list[str]], list[dict]]:
    """(header, rows, points): one row per setting (seeds grouped) and one per job that did not finish."""
    keys = varying_keys(jobs)
    row_keys = [k for k in keys if k != SEED]
    header = [*row_keys, "seeds" if SEED in keys else "jobs", "status", metric_label(jobs, metric), "parameters",
              "updates", "tokens/s", "wall (min)", "folders"]
    rows, points, groups = [], [], {}
    for job in jobs:
        groups.setdefault(tuple(job.overrides.get(k, "") for k in row_keys), []).append(job)
    for setting, members in groups.items():
        done = [j for j in members if j.status == "finished"]
        if done:
            scores = [j.value(metric) for j in done if j.value(metric) is not None]
            params = [j.value("parameters") for j in done if j.value("parameters") is not None]
            wall = [j.value("wall_seconds") / 60 for j in done if j.value("wall_seconds") is not None]
            rows.append([*setting, str(len(done)), "finished", _mean_std(scores, 2),
                         f"{int(statistics.mean(params)):,}" if params else "",
                         _mean([j.value("updates") for j in done if j.value("updates") is not None], 0),
                         _mean([j.value("tokens_per_s") for j in done if j.value("tokens_per_s")], 0),
                         _mean(wall, 1), ", ".join(j.name for j in done)])
            if scores:
                points.append({"label": ", ".join(f"{k}={v}" for k, v in zip(row_keys, setting)) or "all",
                               "score": statistics.mean(scores), "parameters": statistics.mean(params) if params
                               else None, "wall": statistics.mean(wall) if wall else None})
        for job in members:
            if job.status != "finished":
                error = (job.record.get("error") or "").splitlines()[0][:120] if job.record.get("error") else ""
                rows.append([*setting, "", job.status + (f": {error}" if error else ""), "", "", "", "", "", job.name])
    return header, rows, points


def markdown(header: list[str], rows: list[list[str]]) -> str:
    escape = [[c.replace("|", "\\|") for c in r] for r in [header, *rows]]
    lines = ["| " + " | ".join(escape[0]) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in escape[1:]]
    return "\n".join(lines) + "\n"


def plot(points: list[dict], metric_label: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    params = {p["parameters"] for p in points if p["parameters"] is not None}
    x_key, x_label = ("parameters", "parameters") if len(params) > 1 else ("wall", "wall time (min)")
    shown = [p for p in points if p[x_key] is not None]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter([p[x_key] for p in shown], [p["score"] for p in shown])
    for p in shown:
        ax.annotate(p["label"], (p[x_key], p["score"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(x_label)
    ax.set_ylabel(metric_label)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)


def report(sweep_dir: str | Path, metric: str = "score", out: str | Path | None = None) -> str:
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        raise SeqmixError(f"{sweep_dir} is not a folder: give the multirun folder (outputs/multiruns/<date_time>)")
    jobs = read_jobs(sweep_dir)
    if not jobs:
        raise SeqmixError(f"{sweep_dir} holds no Hydra jobs (no */.hydra/overrides.yaml): give the multirun folder")
    header, rows, points = table(jobs, metric)
    out = Path(out) if out is not None else sweep_dir
    text = markdown(header, rows)
    atomic_write_text(out / "report.md", text)
    buffer = io.StringIO()
    csv.writer(buffer).writerows([header, *rows])
    atomic_write_text(out / "report.csv", buffer.getvalue())
    if points:
        plot(points, metric_label(jobs, metric), out / "report.png")
    return text


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["results"]:  # the README's results tables from the recipes' records (seqmix.report.results)
        from seqmix.report import results

        return results.main(argv[1:])
    parser = CommandParser(prog="python -m seqmix.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", help="a multirun folder (outputs/multiruns/<date_time>)")
    parser.add_argument("--metric", default="score", choices=["score", "best_valid"],
                        help="score: the final evaluation (run_test); best_valid: the best validation score")
    parser.add_argument("--out", help="folder for report.md/.csv/.png (default: the multirun folder)")
    args = parser.parse_args(argv)
    return command_status(lambda: print(report(args.sweep_dir, args.metric, args.out), end=""))


if __name__ == "__main__":
    sys.exit(main())
