"""`python -m benchmarks.run` (`make bench`): mixer speed/memory sweep, training throughput of the Multi30k
recipes, autoregressive decoding speed, non-autoregressive (DisCo/CMLM) decoding against their teacher, and the data
pipeline at WMT scale (token stores against the previous in-memory path).

Writes ``benchmarks/results/<timestamp>/``: ``results.json`` (everything, incl. environment) and per section a CSV
and a PNG: ``mixers.*`` (time and memory vs T, log-log), ``training.*``, ``decoding.*``, ``nat.*``, ``data.*``.
Exits with status 1 when a mixer failed its correctness check or a training recipe failed to train, so a broken
op cannot pass unnoticed.
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

from benchmarks import data, decoding, registry, training
from benchmarks.mixers import (
    DEFAULT_LENGTHS,
    MixerBenchConfig,
    PointResult,
    format_scaling,
    format_table,
    run_mixer_benchmark,
    scaling,
)
from benchmarks.plotting import save_figure, style_log_axes

RESULTS_DIR = Path(__file__).resolve().parent / "results"
QUICK_MAX_T, QUICK_REPEATS, QUICK_LIMIT = 512, 2, 100
QUICK_BATCH1_LIMIT = 20
QUICK_DATA_SIZES, QUICK_LM_TOKENS, QUICK_DATA_BATCHES = (20_000,), 1_000_000, 50
SECTIONS = ("mixers", "training", "decoding", "nat", "data")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: T <= {QUICK_MAX_T}, {QUICK_REPEATS} repeats (mixers and training), 1 "
                   f"training warm-up, --limit {QUICK_LIMIT}, --batch1-limit {QUICK_BATCH1_LIMIT}, data at "
                   f"{QUICK_DATA_SIZES[0]:,} pairs and {QUICK_LM_TOKENS:,} LM tokens")
    p.add_argument("--only", choices=SECTIONS, nargs="+", metavar="SECTION",
                   help=f"run only these sections ({', '.join(SECTIONS)}); default: all")
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
    t = p.add_argument_group("training (full updates of the Multi30k CPU recipes)")
    t.add_argument("--train-models", nargs="+", default=list(training.RECIPES), metavar="MODEL",
                   help="recipe models (conf/experiment/multi30k_<name>_cpu.yaml); the baseline "
                   f"{training.BASELINE} is always included")
    t.add_argument("--train-repeats", type=int, default=5, help="timed updates per model (median)")
    t.add_argument("--train-warmup", type=int, default=2, help="untimed updates before the timed ones")
    t.add_argument("--train-max-tokens", type=int, default=None,
                   help="padded tokens per batch (default: each recipe's task.data.max_tokens)")
    t.add_argument("--synthetic", action="store_true",
                   help="random tokens with Multi30k-like lengths instead of the real training batches")
    d = p.add_argument_group("decoding (autoregressive; --data-dir, --limit, --max-tokens also apply to nat)")
    d.add_argument("--ckpt", nargs="+", help="checkpoints to decode with (default: the newest multi30k_ende "
                   "best.ckpt of each autoregressive model in --runs-dir, Transformer first)")
    d.add_argument("--runs-dir", type=Path, nargs="+", default=None,
                   help=f"folders of runs to search (default: {decoding.default_runs_dir()})")
    d.add_argument("--data-dir", type=Path, default=None, help=f"Multi30k folder; default: {decoding.default_data_dir()}")
    d.add_argument("--limit", type=int, default=None, help="decode only the first N val sentences (default: all)")
    d.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    d.add_argument("--max-tokens", type=int, default=8000, help="source tokens per decoding batch")
    n = p.add_argument_group("nat (DisCo/CMLM against their autoregressive teacher, batch 1 and full batches)")
    n.add_argument("--nat-ckpt", nargs="+", help="DisCo/CMLM checkpoints (default: the newest multi30k_ende "
                   "best.ckpt of each non-autoregressive model in --runs-dir, DisCo first)")
    n.add_argument("--nat-teacher", type=Path, default=None,
                   help="autoregressive checkpoint to compare with (default: the newest multi30k Transformer)")
    n.add_argument("--teacher-beam", type=int, default=5)
    n.add_argument("--batch1-limit", type=int, default=200,
                   help="batch size 1 decodes only the first N val sentences (0: as many as --limit)")
    n.add_argument("--length-beam", type=int, default=None, help="NAT candidate lengths (default: the checkpoint's)")
    n.add_argument("--max-iterations", type=int, default=None, help="NAT passes at most (default: the checkpoint's)")
    a = p.add_argument_group("data (synthetic WMT-like corpora and an LM stream; see benchmarks/data.py)")
    a.add_argument("--data-sizes", type=int, nargs="+", default=list(data.DEFAULT_SIZES), metavar="PAIRS",
                   help="translation corpus sizes measured on token stores (two processes share the largest)")
    a.add_argument("--legacy-sizes", type=int, nargs="*", default=list(data.DEFAULT_LEGACY_SIZES), metavar="PAIRS",
                   help=f"sizes also measured on the previous in-memory path (commit {data.LEGACY_COMMIT[:10]}); "
                   "none to skip")
    a.add_argument("--lm-tokens", type=int, default=data.DEFAULT_LM_TOKENS, help="LM stream size (0: skip)")
    a.add_argument("--data-batches", type=int, default=data.LOADER_BATCHES,
                   help="training batches timed for loader throughput (0 and 2 workers)")
    a.add_argument("--data-work", type=Path, default=None,
                   help="folder for the generated corpora and caches (default: a temporary folder, deleted)")
    a.add_argument("--keep-data", action="store_true", help="keep the generated corpora and stores")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's choice)")
    p.add_argument("--out", type=Path, default=None, help="results folder (default: benchmarks/results/<timestamp>)")
    args = p.parse_args(argv)
    if args.quick:
        args.lengths = [t for t in args.lengths if t <= QUICK_MAX_T]
        args.repeats = min(args.repeats, QUICK_REPEATS)
        args.limit = args.limit or QUICK_LIMIT
        args.batch1_limit = min(args.batch1_limit or QUICK_BATCH1_LIMIT, QUICK_BATCH1_LIMIT)
        args.train_repeats = min(args.train_repeats, QUICK_REPEATS)
        args.train_warmup = min(args.train_warmup, 1)
        args.data_sizes = [n for n in args.data_sizes if n <= QUICK_DATA_SIZES[0]] or list(QUICK_DATA_SIZES)
        args.legacy_sizes = [n for n in args.legacy_sizes if n <= QUICK_DATA_SIZES[0]] or (
            list(QUICK_DATA_SIZES) if args.legacy_sizes else [])
        args.lm_tokens = min(args.lm_tokens, QUICK_LM_TOKENS)
        args.data_batches = min(args.data_batches, QUICK_DATA_BATCHES)
    args.only = [s for s in SECTIONS if s in (args.only or SECTIONS)]
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
        style_log_axes(ax, "sequence length T (batch = token budget // T)", ylabel, xbase=2)
    save_figure(fig, path, title)


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
    save_figure(fig, path)


def plot_nat(rows: list[decoding.DecodeResult], path: Path, title: str) -> None:
    """One panel per batching (batch 1, full batches): sentences/s per model, the teacher first; BLEU, the speed
    ratio to the teacher and (NAT) the average iterations written on each bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(r.batching for r in rows))
    fig, axes = plt.subplots(1, len(groups), figsize=(1.0 + 2.6 * len(groups) + 0.9 * len(rows), 4.6), squeeze=False)
    for ax, group in zip(axes[0], groups):
        pts = [r for r in rows if r.batching == group]
        labels = [f"{r.model}\n{'beam ' + str(r.beam) if r.decoder == 'beam' else r.decoder}" for r in pts]
        bars = ax.bar(range(len(pts)), [r.sentences_per_s for r in pts],
                      color=["tab:gray" if r.role == "teacher" else "tab:blue" for r in pts])
        for bar, r in zip(bars, pts):
            text = f"{r.sentences_per_s:.1f}\nBLEU {r.bleu:.1f}"
            text += "" if r.speed_ratio is None else f"\n{r.speed_ratio:.2f}x"
            text += "" if r.avg_iterations is None else f"\n{r.avg_iterations:.1f} it."
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                        fontsize=7)
        ax.set_xticks(range(len(pts)), labels, fontsize=7)
        ax.set_ylim(0, max(r.sentences_per_s for r in pts) * 1.5)
        ax.set_ylabel("sentences / s")
        ax.set_title(f"{group} ({pts[0].sentences} sent.)", fontsize=9)
    save_figure(fig, path, title)


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
    failed, failed_training, failed_data = [], [], []

    if "mixers" in args.only:
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

    if "training" in args.only:
        print(f"\n== training: full updates (forward + loss + backward + optimizer step) of the Multi30k CPU recipes, "
              f"median of {args.train_repeats} after {args.train_warmup} warm-up")
        res = training.run_training_benchmark(args.train_models, warmup=args.train_warmup, repeats=args.train_repeats,
                                              max_tokens=args.train_max_tokens, device=args.device,
                                              synthetic=args.synthetic, data_dir=args.data_dir)
        rows, info = res["rows"], res["info"]
        print(f"\ndata: {'; '.join(info['data']) or '-'}"
              + ("" if info["same_batches"] else "  (WARNING: not the same batches for every model)"))
        print(f"{info['device']}, {info['torch_threads']} threads; speed x = target tokens/s over "
              f"{info['baseline']}'s, time x = ms/update over its, cpu x = CPU ms/update (process time, steadier "
              "than the wall clock on a shared CPU) over its; measured in this run on the same batches\n")
        print(training.format_table(rows))
        write_csv(out_dir / "training.csv", training.as_dicts(rows))
        report["training"] = {"info": info, "rows": training.as_dicts(rows)}
        if any(r.ok for r in rows):
            kind = "synthetic batches" if info["data"] == [training.SYNTHETIC] else "Multi30k train batches"
            training.plot(rows, out_dir / "training.png",
                          f"training updates, {kind}, {info['device']} ({info['torch_threads']} threads)")
        failed_training = [r for r in rows if not r.ok]

    if "decoding" in args.only:
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

    if "nat" in args.only:
        print("\n== nat: DisCo/CMLM decoding against the autoregressive teacher")
        res = decoding.run_nat_benchmark(nat_ckpt=args.nat_ckpt, teacher=args.nat_teacher, teacher_beam=args.teacher_beam,
                                         limit=args.limit, batch1_limit=args.batch1_limit, max_tokens=args.max_tokens,
                                         device=args.device, data_dir=args.data_dir, runs_dir=args.runs_dir,
                                         length_beam=args.length_beam, max_iterations=args.max_iterations)
        if res is None:
            report["nat"] = {"skipped": f"no DisCo/CMLM checkpoint; {decoding.HOW_TO_TRAIN_NAT}"}
        else:
            print("\nspeed x = sentences/s over the teacher's with the same batching, measured in this run; cpu x = the "
                  "same from process CPU time (steadier than the wall clock on a shared CPU)\n")
            print(decoding.format_nat_table(res["rows"]))
            write_csv(out_dir / "nat.csv", decoding.as_dicts(res["rows"]))
            report["nat"] = {"info": res["info"], "rows": decoding.as_dicts(res["rows"])}
            plot_nat(res["rows"], out_dir / "nat.png", f"Multi30k val, {res['info'][0]['device']}")

    if "data" in args.only:
        print("\n== data: token stores against the previous in-memory path, synthetic WMT-like corpora (fresh process "
              "per figure)")
        res = data.run_data_benchmark(sizes=tuple(args.data_sizes), legacy_sizes=tuple(args.legacy_sizes),
                                      lm_tokens=args.lm_tokens, work=args.data_work, data_dir=args.data_dir and
                                      args.data_dir.parent, batches=args.data_batches, threads=args.threads,
                                      keep=args.keep_data, synthetic_steps=args.synthetic)
        info = res["info"]
        print(f"\nrecipe step rate (the baseline of 'x step'): {info['recipe_steps_per_s']:.2f} updates/s "
              f"({info['recipe']}); prep = preprocess.py (legacy: its first run), start = process start to the first "
              "training batch with the store (legacy: its cache) present; anon/file MB = private/file-backed RSS "
              "grown from the imports to the first batch; b/s = training batches/s with 0 and 2 workers\n")
        print(data.format_table(res["rows"]))
        if res["ratios"]:
            print("\n" + data.format_ratios(res["ratios"]))
        if res["sharing"]:
            print("\n" + data.format_sharing(res["sharing"]))
        if res["targets"]:
            print("\n" + data.format_targets(res["targets"]))
        write_csv(out_dir / "data.csv", data.as_dicts(res["rows"]))
        report["data"] = {"info": info, "rows": data.as_dicts(res["rows"]), "ratios": res["ratios"],
                          "sharing": [asdict(s) for s in res["sharing"]], "targets": res["targets"]}
        if any(r.status == "ok" and r.corpus == "translation" for r in res["rows"]):
            data.plot(res["rows"], out_dir / "data.png", "synthetic WMT-like corpora: token stores vs the in-memory path")
        failed_data = [r for r in res["rows"] if r.status != "ok"]

    report["seconds"] = time.perf_counter() - started
    (out_dir / "results.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"\nresults: {out_dir}  ({report['seconds']:.0f}s)")
    if failed:
        print(f"{len(failed)} mixer point(s) FAILED their correctness/run check; no numbers reported for them:",
              file=sys.stderr)
        for r in failed:
            print(f"  {r.mixer} T={r.T}: {r.status}", file=sys.stderr)
    if failed_training:
        print(f"{len(failed_training)} training recipe(s) failed; no numbers reported for them:", file=sys.stderr)
        for r in failed_training:
            print(f"  {r.model}: {r.status}", file=sys.stderr)
    if failed_data:
        print(f"{len(failed_data)} data measurement(s) failed:", file=sys.stderr)
        for r in failed_data:
            print(f"  {r.corpus} {r.size:,} {r.path}: {r.status}", file=sys.stderr)
    return 1 if failed or failed_training or failed_data else 0


if __name__ == "__main__":
    sys.exit(main())
