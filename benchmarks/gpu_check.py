"""``python -m benchmarks.gpu_check --out DIR`` (``make gpu-check``): everything seqmix claims about a CUDA GPU, checked
in one command of a few minutes, with a report (DIR/report.md, DIR/report.json) to commit under benchmarks/results/.

Sections, in order (each gets a share of ``--budget`` seconds; what does not fit is reported as skipped, never guessed):
the environment and the card's measured roofs; every Triton kernel against its float64 reference in fp32/fp16/bf16;
kernel speed against PyTorch and SDPA; a one-process ``trainer=ddp`` run of train.py over NCCL (its checkpoint feeds
the next section); beam-5 decoding eager and compiled; a WMT'16 preset at full size on random data; 100-update
training runs of the Multi30k recipes in bf16-mixed and 16-mixed, eager then compiled. Without CUDA it says so in one
line and exits 0, claiming nothing.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks import common

NO_CUDA = "seqmix gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing was measured"
# NVIDIA data-sheet figures: dense bf16/fp16 tensor-core TFLOP/s (no sparsity) and HBM GB/s, by a name fragment
CARD_SPECS = (("H200", 989.4, 4800.0), ("H100 PCIe", 756.0, 2000.0), ("H100", 989.4, 3350.0),
              ("A100-SXM4-80GB", 312.0, 2039.0), ("A100", 312.0, 1555.0), ("L4", 121.0, 300.0))
RECIPES = ("transformer_small", "lightconv_small", "dynamicconv_small", "talk_small", "convs2s_small")
PRECISIONS = ("bf16-mixed", "16-mixed")


def card_spec(name: str) -> tuple[float | None, float | None]:
    """(peak dense bf16 TFLOP/s, memory GB/s) from the data sheet, (None, None) for a card not in the table."""
    for fragment, tflops, gb_s in CARD_SPECS:
        if fragment in name:
            return tflops, gb_s
    return None, None


@dataclass
class Context:
    device: torch.device
    scratch: Path
    data_dir: Path
    deadline: float = 0.0
    log: Callable = print
    environment: dict = field(default_factory=dict)
    ckpt: str | None = None  # the DDP run's checkpoint, for the decoding section
    kernels: tuple[str, ...] = ()  # the kernel_errors section's kernels (default: all)

    def keep_going(self, needs: float = 0.0) -> bool:
        """Whether a step expected to take ``needs`` seconds still fits before the section's deadline."""
        return time.perf_counter() + needs < self.deadline


def environment_section(ctx: Context) -> list[dict]:
    """Versions, and what this card measures now: a bf16 8192³ matmul and a device-to-device copy."""
    env = common.environment(ctx.device)
    props = torch.cuda.get_device_properties(ctx.device)
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        smi = smi.stdout.strip() or smi.stderr.strip()[:200]
    except (OSError, subprocess.SubprocessError) as err:
        smi = f"nvidia-smi: {err}"
    env |= {"nvidia_smi": smi, "sm_count": props.multi_processor_count,
            "capability": f"sm_{props.major}{props.minor}", "memory_gib": props.total_memory / 2**30,
            "lightning": __import__("lightning").__version__}
    env["spec_tflops_bf16"], env["spec_gb_s"] = card_spec(env["device_name"])
    from benchmarks.training import matmul_gflops

    env["matmul_tflops_bf16"] = matmul_gflops(ctx.device, 8192, torch.bfloat16) / 1e3
    env["copy_gb_s"] = copy_gb_s(ctx.device)
    torch.cuda.empty_cache()
    ctx.environment.update(env)
    ctx.log("  " + ", ".join(f"{k}={v}" for k, v in env.items()))
    return [env | {"status": "ok"}]


def kernel_errors_section(ctx: Context) -> list[dict]:
    from benchmarks import kernels

    return kernels.correctness(ctx.device, keep_going=ctx.keep_going, log=ctx.log, only=ctx.kernels)


def kernel_speed_section(ctx: Context) -> list[dict]:
    from benchmarks import kernels

    return kernels.speed(ctx.device, ctx.environment.get("spec_gb_s"), keep_going=ctx.keep_going, log=ctx.log)


def copy_gb_s(device: torch.device, nbytes: int = 2**30) -> float:
    """A device-to-device copy of ``nbytes``, counting bytes read and written."""
    from triton.testing import do_bench

    src = torch.empty(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / (do_bench(lambda: dst.copy_(src)) / 1e3) / 1e9


DDP_FIELDS = "run seconds exit_code checkpoint status"


def ddp_section(ctx: Context, steps: int = 30) -> list[dict]:
    """``train.py trainer=ddp trainer.devices=1`` (NCCL, world size 1) on the Transformer recipe, validated once."""
    log_dir = ctx.scratch / "ddp"
    args = [sys.executable, "train.py", "experiment=multi30k_transformer_cpu", "trainer=ddp", "trainer.devices=1",
            "trainer.precision=bf16-mixed", f"trainer.max_steps={steps}", "trainer.max_time=null",
            f"trainer.val_check_interval={steps}", "trainer.limit_val_batches=4", "logger=none",
            f"paths.log_dir={log_dir}", f"paths.data_dir={ctx.data_dir}"]
    started = time.perf_counter()
    timeout = max(30.0, ctx.deadline - started)
    row = common.new_row(DDP_FIELDS, run=" ".join(args[2:]))
    try:
        proc = subprocess.run(args, cwd=common.REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        ctx.log(f"  ERROR: still running after {timeout:.0f}s (stopped)")
        return [row | {"seconds": timeout, "status": f"ERROR: still running after {timeout:.0f}s (stopped)"}]
    found = sorted(glob.glob(str(log_dir / "**" / "best.ckpt"), recursive=True))
    ctx.ckpt = found[-1] if found else None
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
    ok = proc.returncode == 0 and ctx.ckpt
    row |= {"seconds": time.perf_counter() - started, "exit_code": proc.returncode, "checkpoint": ctx.ckpt,
            "status": "ok" if ok else f"FAILED: {last}"}
    (ctx.scratch / "ddp.log").write_text(proc.stdout + "\n" + proc.stderr)
    ctx.log(f"  {row['status']} in {row['seconds']:.0f}s")
    return [row]


def decoding_section(ctx: Context) -> list[dict]:
    from benchmarks import decoding

    if not ctx.ckpt:
        return [{"status": "skipped: no checkpoint (the ddp section did not write one)"}]
    s = decoding.Settings(ckpts=(ctx.ckpt,), beams=(5,), compile_decoding=(False, True), limit=500,
                          data_dir=str(ctx.data_dir / "multi30k"), forced_lengths=())  # one model: no ratio to force
    result, _ = decoding.section(s, ctx.device, ctx.scratch, log=ctx.log)
    return result["rows"]


def wmt_section(ctx: Context) -> list[dict]:
    from benchmarks import wmt_scale

    rows = []
    for overrides in (["model=transformer", "task=wmt_ende", "trainer.precision=bf16-mixed"],
                      ["model=dynamicconv", "task=wmt_ende", "trainer.precision=bf16-mixed"],
                      ["experiment=wu2019_wmt_ende_big", "trainer.precision=bf16-mixed"]):
        if not ctx.keep_going():
            rows.append(common.new_row(wmt_scale.FIELDS, preset=" ".join(overrides), status="skipped: time budget"))
            continue
        try:
            rows.append(wmt_scale.measure(overrides, ctx.device))
        except Exception as err:
            rows.append(common.new_row(wmt_scale.FIELDS, preset=" ".join(overrides), status=common.error_status(err)))
        torch.cuda.empty_cache()
        ctx.log(f"  {rows[-1]['preset']}: {common.cell(rows[-1]['tokens_per_s'], '.0f')} tok/s, "
                f"{common.cell(rows[-1]['peak_mem_mb'], '.0f')} MB  {rows[-1]['status']}")
    return add_mfu(rows, ctx)


# seconds a training row is expected to take on an H100 (a compiled one mostly compiles): rows that would not fit
# before the deadline are reported as skipped instead of overrunning the check
ROW_SECONDS = {False: 15.0, True: 60.0}


def training_section(ctx: Context, updates: int = 100, warmup: int = 10) -> list[dict]:
    """``updates`` updates (``warmup`` untimed) per recipe and precision: eager first, then compiled."""
    from benchmarks import training

    s = training.Settings(warmup=warmup, repeats=updates - warmup, data_dir=str(ctx.data_dir))
    rows = []
    for compiled in (False, True):
        for precision in PRECISIONS:
            for model in RECIPES:
                variant = [f"trainer.precision={precision}", f"compile={str(compiled).lower()}"]
                if not ctx.keep_going(ROW_SECONDS[compiled]):
                    rows.append(common.new_row(training.FIELDS, model=model, variant=" ".join(variant),
                                               status="skipped: time budget"))
                    continue
                row = training.measure_row(model, s, variant, ctx.device) | {"variant": " ".join(variant)}
                rows.append(row)
                torch.cuda.empty_cache()
                ctx.log(f"  {model} [{row['variant']}]: {common.cell(row['tokens_per_s'], '.0f')} tok/s, loss "
                        f"{common.cell(row['first_loss'], '.2f')} -> {common.cell(row['final_loss'], '.2f')}, first "
                        f"update {common.cell(row['first_update_s'], '.1f')} s  {row['status']}")
    for row in rows:
        row["tflops_per_s"] = row["gflops_per_s"] / 1e3 if row.get("gflops_per_s") else None
    return add_mfu(rows, ctx)


def add_mfu(rows: list[dict], ctx: Context) -> list[dict]:
    """Model FLOPs utilization: the update's counted FLOP/s over the card's data-sheet bf16 peak (and over the
    matmul this run measured)."""
    spec, measured = ctx.environment.get("spec_tflops_bf16"), ctx.environment.get("matmul_tflops_bf16")
    for row in rows:
        achieved = row.get("tflops_per_s")
        row["mfu"] = achieved / spec if achieved and spec else None
        row["of_matmul"] = achieved / measured if achieved and measured else None
    return rows


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    run: Callable[[Context], list[dict]]
    seconds: float  # its share of the default budget; scaled with --budget
    columns: tuple[str, ...]  # report.md's columns (report.json keeps every field)


SECTIONS = (
    Section("environment", "Environment and measured roofs", environment_section, 15,
            ("device_name", "capability", "sm_count", "memory_gib", "nvidia_smi", "torch", "cuda", "triton", "lightning",
             "matmul_tflops_bf16", "spec_tflops_bf16", "copy_gb_s", "spec_gb_s")),
    Section("kernel_errors", "Triton kernels against float64 references (rms and max error ratios)",
            kernel_errors_section, 90,
            ("kernel", "case", "dtype", "triton_rms", "triton_max", "torch_rms", "torch_max", "rms_limit", "max_limit",
             "worst_output", "status")),
    Section("kernel_speed", "Kernel speed against the PyTorch path (bf16, 16K tokens, d=512, K=31)",
            kernel_speed_section, 25,
            ("kernel", "T", "batch", "triton_fwd_ms", "torch_fwd_ms", "triton_fwd_bwd_ms", "torch_fwd_bwd_ms",
             "speedup_fwd_bwd", "fwd_gb_per_s", "bandwidth_fraction", "status")),
    Section("wmt", "WMT'16 En-De presets at full size, random batches of WMT lengths", wmt_section, 40,
            ("preset", "parameters", "precision", "tgt_tokens_per_update", "ms_per_update", "tokens_per_s",
             "tflops_per_s", "mfu", "peak_mem_mb", "first_loss", "final_loss", "status")),
    Section("training", "Multi30k recipes, 100 updates (median of the last 90)", training_section, 170,
            ("model", "variant", "parameters", "tgt_tokens_per_update", "first_update_s", "ms_per_update",
             "tokens_per_s", "tflops_per_s", "mfu", "peak_mem_mb", "first_loss", "final_loss", "status")),
    Section("ddp", "train.py trainer=ddp, one process over NCCL", ddp_section, 90,
            ("run", "seconds", "exit_code", "status")),
    Section("decoding", "Beam-5 decoding of the DDP run's checkpoint on Multi30k val, eager and compiled",
            decoding_section, 60, ("model", "beam", "compiled", "sentences", "sentences_per_s", "tokens_per_s",
                                   "warmup_seconds", "compiled_ratio", "status")),
)


def run_sections(ctx: Context, sections: tuple[Section, ...], budget: float,
                 after_each: Callable[[dict], None] = lambda results: None) -> dict:
    """Each section until its deadline (its share of what is left); a section that raises is one ERROR row.
    ``after_each(results so far)`` runs after every section (the report is rewritten, so a killed check keeps it)."""
    results, started = {}, time.perf_counter()
    total = sum(s.seconds for s in sections)
    for k, section in enumerate(sections):
        now = time.perf_counter()
        left = budget - (now - started)
        share = left * section.seconds / sum(s.seconds for s in sections[k:]) if left > 0 else 0
        ctx.deadline = now + share
        ctx.log(f"\n== {section.name}: {section.title} (up to {share:.0f}s of {budget:.0f}s, {total:.0f} planned)")
        try:
            rows = section.run(ctx) if share > 0 or section.name == "environment" else [{"status": "skipped: time budget"}]
        except Exception as err:
            rows = [{"status": common.error_status(err), "traceback": traceback.format_exc()[-2000:]}]
        results[section.name] = {"title": section.title, "seconds": time.perf_counter() - now, "rows": rows}
        after_each(results)
    return results


def markdown(results: dict, environment: dict, argv: list[str]) -> str:
    """The report: a header, then one table per section with its columns (numbers to three significant digits)."""
    columns = {s.name: s.columns for s in SECTIONS}
    failed = [f"{name}: {r.get('status')}" for name, sec in results.items() for r in sec["rows"] if is_failure(r)]
    lines = [f"# seqmix GPU check: {environment.get('device_name', '?')}", "",
             f"`python -m benchmarks.gpu_check {' '.join(argv)}`; torch {environment.get('torch')}, "
             f"triton {environment.get('triton')}, CUDA {environment.get('cuda')}.", "",
             f"**{len(failed)} failed or errored rows**" + (":" if failed else "."), *(f"- {f}" for f in failed[:40]), ""]
    for name, section in results.items():
        lines += [f"## {section['title']}", "", f"{section['seconds']:.0f} s.", ""]
        keys = [c for c in columns.get(name, ()) if any(c in r for r in section["rows"])] or ["status"]
        lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(format_cell(r.get(k)) for k in keys) + " |" for r in section["rows"]]
        lines.append("")
    return "\n".join(lines)


def is_failure(row: dict) -> bool:
    status = str(row.get("status", "ok"))
    return status.startswith(("FAILED", "ERROR", "failed", "error"))


def format_cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value).replace("|", "/").replace("\n", " ")


def write_report(out: Path, results: dict, environment: dict, argv: list[str]) -> None:
    """report.json (every field) and report.md, each written whole or not at all."""
    from seqmix.files import atomic_write_text

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "report.json", json.dumps({"argv": argv, "environment": environment, "sections": results},
                                                      indent=1, default=str) + "\n")
    atomic_write_text(out / "report.md", markdown(results, environment, argv) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for report.md and report.json")
    p.add_argument("--budget", type=float, default=420.0, help="seconds for all sections (default 420)")
    p.add_argument("--only", nargs="+", choices=[s.name for s in SECTIONS], metavar="SECTION",
                   help=", ".join(s.name for s in SECTIONS) + " (environment always runs)")
    p.add_argument("--kernels", nargs="+", default=(), metavar="KERNEL",
                   help="kernel_errors: only these (lightconv dynamicconv talk convs2s_step fused_xent)")
    p.add_argument("--data-dir", type=Path, default=common.DATA_DIR, help="folder holding multi30k/")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_CUDA)
        return 0
    os.environ.setdefault("WANDB_MODE", "offline")
    sections = tuple(s for s in SECTIONS if not args.only or s.name in args.only or s.name == "environment")
    with tempfile.TemporaryDirectory(prefix="seqmix-gpu-check-") as scratch:
        ctx = Context(torch.device("cuda"), Path(scratch), args.data_dir.resolve(), log=lambda *a: print(*a, flush=True),
                      kernels=tuple(args.kernels))
        results = run_sections(ctx, sections, args.budget,
                               after_each=lambda done: write_report(args.out, done, ctx.environment, argv))
    failed = sum(is_failure(r) for sec in results.values() for r in sec["rows"])
    print(f"\nreport: {args.out / 'report.md'} ({failed} failed or errored rows)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
