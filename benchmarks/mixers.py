"""Mixer sweep: ``y = mixer(x); y.backward(g)`` of one layer of every ``conf/mixer`` mixer over T, batch = budget // T.
A point is checked before it is timed (:func:`check`): a wrong mixer gets no numbers. On CPU every point runs in a
fresh process, so that its peak RSS is its own."""

from __future__ import annotations

import copy
import ctypes
import gc
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.plotting import line_panels
from seqmix.config.mixer_group import mixer_class, mixer_config, mixer_factory, mixer_names
from seqmix.models.stack import build_mixer

BASELINE = "self_attention"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FIELDS = ("mixer causal T batch embed_dim dtype status fwd_ms fwd_bwd_ms fwd_bwd_ms_min fwd_bwd_ms_max tokens_per_s "
          "peak_mem_mb time_ratio mem_ratio repeats note")


@dataclass
class Settings:
    lengths: tuple[int, ...] = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
    embed_dim: int = 512
    heads: int = 8
    kernel_size: int = 31  # for the mixers whose config has one
    token_budget: int = 16384
    repeats: int = 5
    warmup: int = 1
    dtype: str = "auto"  # fp32 on CPU, bf16 on CUDA; or fp16
    isolate: bool = True  # CPU: a fresh process per point
    mixers: tuple[str, ...] = ()  # rows to measure (default: all); the baseline is always measured
    conf_dirs: tuple[str, ...] = ()  # extra config folders whose mixer/ joins the group (a plugin's)
    timeout: float = 1800.0  # seconds before an isolated point is given up


QUICK = {"lengths": (64, 128, 256, 512), "repeats": 2}


class MixerCheckError(RuntimeError):
    """The mixer's output or gradient is wrong: its timings must not be reported."""


def entries(s: Settings) -> list[tuple[str, str, bool]]:
    """(row, group name, causal): the baseline, its causal twin, then the group's other mixers."""
    rows = [(BASELINE, BASELINE, False), (BASELINE + "_causal", BASELINE, True)]
    rows += [(n, n, False) for n in mixer_names(s.conf_dirs) if n != BASELINE]
    return [e for e in rows if not s.mixers or e[0] in (*s.mixers, BASELINE)]


def dtype_of(s: Settings, device: torch.device) -> str:
    return s.dtype if s.dtype != "auto" else "bf16" if device.type == "cuda" else "fp32"


def checked(name: str, x: torch.Tensor, y, grad: torch.Tensor | None | bool = False) -> torch.Tensor:
    """``y`` if of ``x``'s shape (checked before backward) and, given the gradient after backward, both finite."""
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        raise MixerCheckError(f"{name}: output shape {tuple(getattr(y, 'shape', ()))} != input shape {tuple(x.shape)}")
    if grad is None:
        raise MixerCheckError(f"{name}: no gradient reached the input")
    if grad is not False and not (bool(torch.isfinite(y).all()) and bool(torch.isfinite(grad).all())):
        raise MixerCheckError(f"{name}: output or input gradient has NaN/inf")
    return y


def check(name: str, mixer: torch.nn.Module, x: torch.Tensor) -> None:
    """The mixer against a copy on its PyTorch path (``kernel_backend=torch``), dropout off: finite and equal."""
    reference = copy.deepcopy(mixer)
    for m in (m for m in reference.modules() if hasattr(m, "kernel_backend")):
        m.kernel_backend = "torch"
    results = []
    for m in (mixer, reference):
        xi = x.detach().clone().requires_grad_(True)
        y = checked(name, x, m.eval()(xi))
        y.backward(torch.ones_like(y))
        results.append((checked(name, x, y, xi.grad).detach(), xi.grad))
        m.train()
    tol = 1e-4 if x.dtype == torch.float32 else 3e-2
    if not all(torch.allclose(a, b, rtol=tol, atol=tol) for a, b in zip(*results)):
        raise MixerCheckError(f"{name}: output or gradient differs from the PyTorch reference path")


def peak_bytes(fn, device: torch.device) -> tuple[object, int]:
    """(fn(), peak bytes over before): CUDA allocator peak, or the rise of VmHWM (reset) over VmRSS on CPU."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        return fn(), torch.cuda.max_memory_allocated(device) - base
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    base = common.proc_status_kb()["VmRSS"]
    Path("/proc/self/clear_refs").write_text("5")
    out = fn()
    return out, max(common.proc_status_kb()["VmHWM"] - base, 0) * 1024


def measure_point(name: str, group: str, causal: bool, T: int, s: Settings, device: torch.device) -> dict:
    """Check, then the peak memory of the first full-size step, then time; MixerCheckError for a wrong mixer."""
    row = new_point(name, causal, T, s, device)
    options = {"kernel_size": s.kernel_size} if "kernel_size" in mixer_config(group, s.conf_dirs) else {}
    torch.manual_seed(0)
    mixer = build_mixer(mixer_factory(group, s.conf_dirs, **options), s.embed_dim, causal, 0, s.heads)
    mixer = mixer.to(device=device, dtype=DTYPES[row["dtype"]]).train()
    row["note"] = ", ".join([mixer_class(group, s.conf_dirs).__name__, f"H={s.heads}", *(f"K={k}" for k in options.values())])
    x = torch.randn(row["batch"], T, s.embed_dim, device=device, dtype=DTYPES[row["dtype"]], requires_grad=True)
    g = torch.randn_like(x)
    check(name, mixer, x[:2, :64])  # also pays one-time initialisation before the memory probe

    def step():
        x.grad = None
        mixer.zero_grad(set_to_none=True)
        y = checked(name, x, mixer(x))
        y.backward(g)
        return y

    y, peak = peak_bytes(step, device)
    checked(name, x, y, x.grad)
    del y
    total = common.time_ms(step, s.repeats, s.warmup, device)
    return row | {"fwd_ms": statistics.median(common.time_ms(lambda: mixer(x), s.repeats, s.warmup, device)),
                  "fwd_bwd_ms": statistics.median(total), "fwd_bwd_ms_min": min(total), "fwd_bwd_ms_max": max(total),
                  "tokens_per_s": row["batch"] * T / statistics.median(total) * 1e3, "peak_mem_mb": peak / 2**20,
                  "repeats": len(total)}


def new_point(name: str, causal: bool, T: int, s: Settings, device: torch.device, status: str = "ok") -> dict:
    return common.new_row(FIELDS, mixer=name, causal=causal, T=T, batch=max(1, s.token_budget // T), status=status,
                          embed_dim=s.embed_dim, dtype=dtype_of(s, device), repeats=0, note="")


def run_point(name: str, group: str, causal: bool, T: int, s: Settings, device: torch.device) -> dict:
    """One point, in a fresh process when ``s.isolate`` on CPU; a failure becomes a row without numbers."""
    try:
        if s.isolate and device.type == "cpu":
            spec = {"point": [name, group, causal, T], "settings": asdict(s), "threads": torch.get_num_threads()}
            return common.child_result(common.spawn("benchmarks.mixers:child", spec), s.timeout)
        return measure_point(name, group, causal, T, s, device)
    except MixerCheckError as err:
        return new_point(name, causal, T, s, device, f"failed: {err}")
    except Exception as err:  # out of memory, unsupported shape, a crashed child: reported, the sweep goes on
        return new_point(name, causal, T, s, device, f"error: {type(err).__name__}: {str(err)[:200]}".splitlines()[0])


def child(spec: dict) -> None:
    torch.set_num_threads(spec["threads"])
    common.report(run_point(*spec["point"], Settings(**spec["settings"] | {"isolate": False}), torch.device("cpu")))


TABLE = [("mixer", "mixer", ""), ("T", "T", ""), ("batch", "batch", ""), ("fwd ms", "fwd_ms", ".2f"),
         ("fwd+bwd ms", "fwd_bwd_ms", ".2f"),
         ("(min-max)", lambda r: f"{r['fwd_bwd_ms_min']:.1f}-{r['fwd_bwd_ms_max']:.1f}" if common.ok(r) else None, ""),
         ("time x", "time_ratio", ".2f"), ("peak MB", "peak_mem_mb", ".1f"), ("mem x", "mem_ratio", ".2f"),
         ("status", lambda r: "ok" if common.ok(r) else r["status"].upper(), "")]


def plot(rows: list[dict], path: Path, title: str) -> None:
    """Time and memory against T, a line per mixer, a dotted ∝ T guide through the first point (quadratic cost)."""
    panels, first = [], next(r for r in rows if common.ok(r))
    for key, ylabel in (("fwd_bwd_ms", "forward+backward time per batch (ms)"), ("peak_mem_mb", "peak memory (MB)")):
        series = {}
        for name in dict.fromkeys(r["mixer"] for r in rows):
            failed = ",".join(str(r["T"]) for r in rows if r["mixer"] == name and not common.ok(r))
            series[name + (f" (FAILED at T={failed})" if failed else "")] = [
                (r["T"], r[key]) for r in rows if r["mixer"] == name and common.ok(r) and r[key]]
        series["∝ T (quadratic cost)"] = [(t, first[key] * t / first["T"]) for t in sorted({r["T"] for r in rows})]
        panels.append((ylabel, series))
    line_panels(panels, "sequence length T (batch = token budget // T)", path, title, xbase=2)


def section(s: Settings, device: torch.device, out: Path, log=print) -> tuple[dict, list[str]]:
    """Every (mixer, T) point, T outer: a row and its baseline are measured seconds apart, under the same load."""
    env = common.environment(device)
    method = ("cuda: max_memory_allocated during one fwd+bwd minus allocated before" if device.type == "cuda" else
              "cpu: rise of peak RSS (VmHWM reset via /proc/self/clear_refs) over RSS before the first full-size "
              "fwd+bwd, in " + ("a fresh process per point" if s.isolate else "this process (reuse may hide some)"))
    log(f"== mixers: d={s.embed_dim}, {s.token_budget} tokens/batch, {dtype_of(s, device)} on {env['device_name']}, "
        f"torch {env['torch']}, triton {env['triton']}, {env['torch_threads']} threads\npeak memory: {method}")
    rows, order = [], [e[0] for e in entries(s)]
    for T in s.lengths:
        for name, group, causal in entries(s):
            rows.append(run_point(name, group, causal, T, s, device))
            log(f"  {name:<24} T={T:<5} {common.cell(rows[-1]['fwd_bwd_ms'], '9.2f')} ms  {rows[-1]['status']}")
    rows.sort(key=lambda r: (order.index(r["mixer"]), r["T"]))
    common.add_ratios(rows, lambda r: r["T"], lambda r: r["mixer"] == BASELINE, time_ratio="fwd_bwd_ms",
                      mem_ratio="peak_mem_mb")
    common.print_table(f"time x, mem x: over {BASELINE} at the same T, this run", rows, TABLE)
    if any(map(common.ok, rows)):
        plot(rows, out / "mixers.png", f"{env['device_name']}, {dtype_of(s, device)}, d={s.embed_dim}, B·T={s.token_budget}")
    res = {"env": env, "memory_method": method, "baseline": BASELINE, "rows": common.write_csv(out / "mixers.csv", rows)}
    return res, [f"mixer {r['mixer']} T={r['T']}: {r['status']}" for r in rows if not common.ok(r)]
