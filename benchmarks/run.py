"""`python -m benchmarks.run` (`make bench`): mixer speed/memory sweep and decoding speed, tables + files.

Writes ``benchmarks/results/<timestamp>/``: ``results.json`` (everything, incl. environment), ``mixers.csv``,
``decoding.csv``, ``mixers.png`` (time and memory vs T, log-log) and ``decoding.png``.
Exits with status 1 when a mixer failed its correctness check, so a broken op cannot pass unnoticed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from dataclasses import asdict, fields
from datetime import datetime
from pathlib import Path

import torch

from benchmarks import decoding, registry
from benchmarks.mixers import (
    DEFAULT_LENGTHS,
    MixerBenchConfig,
    PointResult,
    format_scaling,
    format_table,
    run_mixer_benchmark,
    scaling,
)

RESULTS_DIR = Path(__file__).resolve().parent / "results"
QUICK_MAX_T, QUICK_REPEATS, QUICK_LIMIT = 512, 2, 100


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: T <= {QUICK_MAX_T}, {QUICK_REPEATS} repeats, --limit {QUICK_LIMIT}")
    p.add_argument("--only", choices=["mixers", "decoding"], help="run one section only")
    g = p.add_argument_group("mixers")
    g.add_argument("--mixers", nargs="+", metavar="NAME",
                   help=f"registry names (baseline always kept); known: {', '.join(e.name for e in registry.ENTRIES)}")
    g.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS), metavar="T")
    g.add_argument("--embed-dim", type=int, default=512)
    g.add_argument("--token-budget", type=int, default=16384, help="tokens per batch: batch = budget // T")
    g.add_argument("--repeats", type=int, default=5, help="timed forward+backward passes per point (median)")
    g.add_argument("--warmup", type=int, default=1, help="untimed passes before the timed ones")
    g.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                   help="auto: fp32 on CPU, bf16 (fp16 without bf16 support) on CUDA")
    g.add_argument("--in-process", action="store_true",
                   help="CPU: measure every point in this process (faster, memory numbers less trustworthy)")
    d = p.add_argument_group("decoding")
    d.add_argument("--ckpt", nargs="+", help="checkpoints to decode with (default: the newest multi30k_ende "
                   "best.ckpt of each model in --runs-dir, Transformer first)")
    d.add_argument("--runs-dir", type=Path, default=None, help=f"default: {decoding.default_runs_dir()}")
    d.add_argument("--data-dir", type=Path, default=None, help=f"Multi30k folder; default: {decoding.default_data_dir()}")
    d.add_argument("--limit", type=int, default=None, help="decode only the first N val sentences (default: all)")
    d.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    d.add_argument("--max-tokens", type=int, default=8000, help="source tokens per decoding batch")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results/<timestamp>)")
    args = p.parse_args(argv)
    if args.quick:
        args.lengths = [t for t in args.lengths if t <= QUICK_MAX_T]
        args.repeats = min(args.repeats, QUICK_REPEATS)
        args.limit = args.limit or QUICK_LIMIT
    return args


# ----------------------------------------------------------------------------------------------- outputs

def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _point_dict(r: PointResult) -> dict:
    return {f.name: getattr(r, f.name) for f in fields(r) if f.name != "extra"}


def plot_mixers(rows: list[PointResult], path: Path, title: str) -> None:
    """Time and peak memory vs T, log-log, one line per mixer; a dotted ∝T guide marks quadratic growth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    names = list(dict.fromkeys(r.mixer for r in rows))
    panels = [("fwd_bwd_ms", "forward+backward time per batch (ms)"), ("peak_mem_mb", "peak memory (MB)")]
    for ax, (key, ylabel) in zip(axes, panels):
        for name in names:
            pts = [(r.T, getattr(r, key)) for r in rows if r.mixer == name and r.ok and getattr(r, key)]
            failed = [r.T for r in rows if r.mixer == name and not r.ok]
            label = name + (f" (FAILED at T={','.join(map(str, failed))})" if failed else "")
            if pts:
                ax.plot(*zip(*pts), marker="o", label=label)
            else:
                ax.plot([], [], "x", label=label)
        ok = [r for r in rows if r.ok and getattr(r, key)]
        if ok:
            t0, v0 = ok[0].T, getattr(ok[0], key)
            ts = sorted({r.T for r in ok})
            ax.plot(ts, [v0 * t / t0 for t in ts], ":", color="gray", label="∝ T (quadratic cost)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length T (batch = token budget // T)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_decoding(rows: list[decoding.DecodeResult], path: Path, title: str) -> None:
    """Sentences/s per model, one bar per beam size, BLEU written on each bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.model for r in rows))
    beams = sorted({r.beam for r in rows})
    width = 0.8 / len(beams)
    fig, ax = plt.subplots(figsize=(2.2 + 1.8 * len(models), 4.4))
    for k, beam in enumerate(beams):
        pts = [(models.index(r.model), r) for r in rows if r.beam == beam]
        bars = ax.bar([i + k * width for i, _ in pts], [r.sentences_per_s for _, r in pts], width, label=f"beam {beam}")
        for bar, (_, r) in zip(bars, pts):
            ax.annotate(f"{r.sentences_per_s:.0f}\nBLEU\n{r.bleu:.1f}", (bar.get_x() + bar.get_width() / 2,
                        bar.get_height()), ha="center", va="bottom", fontsize=7)
    ax.set_xticks([i + width * (len(beams) - 1) / 2 for i in range(len(models))], models, fontsize=8)
    ax.set_ylabel("sentences / s")
    ax.set_ylim(0, max(r.sentences_per_s for r in rows) * 1.35)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _contention_warning() -> str | None:
    if not hasattr(os, "getloadavg"):
        return None
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > 0.5 * cores:
        return (f"warning: load average {load:.1f} on {cores} cores before starting: another job is using the CPU, "
                "absolute times are inflated (ratios within this run stay comparable); --threads 1 is steadier")
    return None


# ----------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    out_dir = args.out or RESULTS_DIR / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    warning = _contention_warning()
    if warning:
        print(warning)
    report: dict = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                    "started": datetime.now().isoformat(timespec="seconds"), "warning": warning}
    failed = []

    if args.only in (None, "mixers"):
        cfg = MixerBenchConfig(lengths=tuple(args.lengths), embed_dim=args.embed_dim, token_budget=args.token_budget,
                               repeats=args.repeats, warmup=args.warmup, device=args.device, dtype=args.dtype,
                               isolate=not args.in_process, threads=args.threads)
        entries = registry.select(args.mixers)
        print(f"== mixers: d={cfg.embed_dim}, {cfg.token_budget} tokens/batch, {cfg.resolved_dtype()} on "
              f"{cfg.resolved_device()}, median of {cfg.repeats} after {cfg.warmup} warm-up")
        res = run_mixer_benchmark(entries, cfg, baseline=registry.BASELINE)
        rows = res["rows"]
        env = res["env"]
        print(f"\n{env['device_name']} | torch {env['torch']} | triton {env['triton']} | threads {env['torch_threads']}")
        print(f"peak memory: {res['memory_method']}")
        print(f"ratios (time x, mem x) are against {res['baseline']} at the same T, measured in this run\n")
        print(format_table(rows))
        growth = scaling(rows, ref_T=512)
        if growth:
            print("\nper-token cost at the longest T over T_ref (512 when measured): 1.00 = linear in T")
            print(format_scaling(growth))
        failed = [r for r in rows if not r.ok]
        write_csv(out_dir / "mixers.csv", [_point_dict(r) for r in rows])
        report["mixers"] = {k: v for k, v in res.items() if k != "rows"} | {"rows": [asdict(r) for r in rows],
                                                                             "scaling": growth}
        title = (f"{env['device_name']}, {cfg.resolved_dtype()}, d={cfg.embed_dim}, {cfg.token_budget} tokens/batch, "
                 f"torch {env['torch']}")
        if any(r.ok for r in rows):
            plot_mixers(rows, out_dir / "mixers.png", title)

    if args.only in (None, "decoding"):
        print("\n== decoding")
        res = decoding.run_decoding_benchmark(ckpt=args.ckpt, beams=tuple(args.beams), limit=args.limit,
                                              max_tokens=args.max_tokens, device=args.device, data_dir=args.data_dir,
                                              runs_dir=args.runs_dir)
        if res is None:
            report["decoding"] = {"skipped": f"no checkpoint; {decoding.HOW_TO_TRAIN}"}
        else:
            print()
            print(decoding.format_table(res["rows"]))
            write_csv(out_dir / "decoding.csv", decoding.as_dicts(res["rows"]))
            report["decoding"] = {"info": res["info"], "rows": decoding.as_dicts(res["rows"])}
            plot_decoding(res["rows"], out_dir / "decoding.png",
                          f"Multi30k val ({res['rows'][0].sentences} sent.), {res['info'][0]['device']}")

    report["seconds"] = time.perf_counter() - started
    (out_dir / "results.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\nresults: {out_dir}  ({report['seconds']:.0f}s)")
    if failed:
        print(f"{len(failed)} mixer point(s) FAILED their correctness/run check; no numbers reported for them:",
              file=sys.stderr)
        for r in failed:
            print(f"  {r.mixer} T={r.T}: {r.status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
