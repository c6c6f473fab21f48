"""Mixer-level benchmark: forward+backward time and peak memory of each registry mixer over sequence length.

Every point keeps the number of tokens per batch fixed (``batch = token_budget // T``), so a mixer that is
linear in T shows a flat line and a quadratic one grows with T. Before a point is timed, its mixer must
produce a finite output of the input's shape and finite input gradients; a mixer that does not is marked
failed and gets no numbers (a fast wrong op is not a result).

Peak memory:
  * CUDA: ``torch.cuda.max_memory_allocated`` during one forward+backward, minus what was allocated before.
  * CPU: the rise of the process's peak resident set (``VmHWM``, reset through ``/proc/self/clear_refs``)
    over its resident set just before the call, measured on the first full-size forward+backward in a fresh
    subprocess per (mixer, T) point, so that memory freed by earlier points cannot be reused and hidden.
Both count activations, saved tensors, gradients and temporaries; not parameters or the input itself.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from benchmarks import registry
from benchmarks.registry import MixerEntry

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LENGTHS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
RESULT_PREFIX = "SEQMIX_BENCH_RESULT "
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class MixerCheckError(RuntimeError):
    """The mixer's output or gradient is wrong (shape, NaN/inf): its timings must not be reported."""


@dataclass
class MixerBenchConfig:
    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    embed_dim: int = 512
    token_budget: int = 16384
    repeats: int = 5
    warmup: int = 1
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (fp32 on CPU, bf16/fp16 on CUDA) | fp32 | bf16 | fp16
    isolate: bool = True  # CPU: one fresh subprocess per point (honest peak RSS); ignored on CUDA
    seed: int = 0
    threads: int | None = None  # CPU intra-op threads (None: torch's default); 1 is steadier on a busy machine
    point_timeout: float = 1800.0  # seconds before an isolated point is given up

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def resolved_dtype(self) -> str:
        if self.dtype != "auto":
            if self.dtype not in DTYPES:
                raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(DTYPES)}")
            return self.dtype
        if self.resolved_device().type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "fp32"


@dataclass
class PointResult:
    mixer: str
    causal: bool
    T: int
    batch: int
    embed_dim: int
    dtype: str
    status: str = "ok"  # ok | failed: <why> | error: <why>
    fwd_ms: float | None = None
    fwd_bwd_ms: float | None = None
    fwd_bwd_ms_min: float | None = None
    fwd_bwd_ms_max: float | None = None
    tokens_per_s: float | None = None
    peak_mem_mb: float | None = None
    time_ratio: float | None = None  # fwd_bwd_ms / baseline's at the same T
    mem_ratio: float | None = None
    repeats: int = 0
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ----------------------------------------------------------------------------------------------- environment

def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict:
    """What the numbers depend on; written next to them so two result folders can be compared honestly."""
    try:
        import triton

        triton_version = triton.__version__
    except Exception:  # not installed (CPU-only boxes may lack it)
        triton_version = None
    env = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else _cpu_name(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if hasattr(os, "getloadavg"):
        # A busy machine (another training job) slows every row; the ratios stay comparable, the ms do not.
        env["loadavg_1min"] = round(os.getloadavg()[0], 2)
    return env


# ----------------------------------------------------------------------------------------------- memory probes

def _proc_status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _malloc_trim() -> None:
    """Hand freed heap pages back to the OS so the baseline RSS is not inflated by earlier garbage."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def memory_method(device: torch.device, isolate: bool) -> str:
    if device.type == "cuda":
        return "cuda: torch.cuda.max_memory_allocated during one fwd+bwd minus memory allocated before it"
    where = "a fresh subprocess per (mixer, T) point" if isolate else "the benchmark process itself (allocator reuse may hide some)"
    if _proc_status_kb("VmHWM") is not None and _reset_peak_rss():
        return f"cpu: rise of peak RSS (VmHWM reset via /proc/self/clear_refs) over RSS before the first full-size fwd+bwd, in {where}"
    return f"cpu: rise of ru_maxrss over RSS before the first full-size fwd+bwd (a lower bound: no peak reset), in {where}"


class _PeakMemory:
    """Peak extra bytes of the code run between ``start()`` and ``stop()``."""

    def __init__(self, device: torch.device):
        self.device = device

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        gc.collect()
        _malloc_trim()
        self.base = (_proc_status_kb("VmRSS") or 0) * 1024
        self.can_reset = _reset_peak_rss()

    def stop(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return float(torch.cuda.max_memory_allocated(self.device) - self.base)
        hwm_kb = _proc_status_kb("VmHWM") if self.can_reset else None
        if hwm_kb is None:
            import resource

            hwm_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return float(max(hwm_kb * 1024 - self.base, 0))


# ----------------------------------------------------------------------------------------------- one point

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_shape(name: str, x: torch.Tensor, y) -> None:
    """Called between forward and backward, so a wrong shape is reported as such rather than as an autograd error."""
    if not isinstance(y, torch.Tensor):
        raise MixerCheckError(f"{name}: returned {type(y).__name__}, expected a tensor")
    if y.shape != x.shape:
        raise MixerCheckError(f"{name}: output shape {tuple(y.shape)} != input shape {tuple(x.shape)}")


def check_finite(name: str, y: torch.Tensor, grad_x: torch.Tensor | None) -> None:
    """Refuse a mixer whose output or input gradient holds NaN/inf, or whose output ignores its input."""
    if not bool(torch.isfinite(y).all()):
        raise MixerCheckError(f"{name}: output has NaN/inf")
    if grad_x is None:
        raise MixerCheckError(f"{name}: no gradient reached the input (output detached from it?)")
    if not bool(torch.isfinite(grad_x).all()):
        raise MixerCheckError(f"{name}: input gradient has NaN/inf")


def _fwd_bwd(mixer: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor, device: torch.device,
             check_name: str | None = None):
    """One training-style step; returns (output, seconds for forward, seconds for forward+backward).

    With ``check_name`` the output shape is checked before backward (timings of checked calls are unused).
    """
    x.grad = None
    mixer.zero_grad(set_to_none=True)
    _sync(device)
    t0 = time.perf_counter()
    y = mixer(x)
    _sync(device)
    t1 = time.perf_counter()
    if check_name is not None:
        check_shape(check_name, x, y)
    y.backward(grad)
    _sync(device)
    t2 = time.perf_counter()
    return y, t1 - t0, t2 - t0


def measure_point(entry: MixerEntry, T: int, cfg: MixerBenchConfig) -> PointResult:
    """Check, then measure memory and time of one (mixer, T) point in this process.

    Raises :class:`MixerCheckError` if the mixer's output or gradient is wrong; nothing is timed then.
    """
    device = cfg.resolved_device()
    dtype_name = cfg.resolved_dtype()
    dtype = DTYPES[dtype_name]
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    batch = max(1, cfg.token_budget // T)
    result = PointResult(entry.name, entry.causal, T, batch, cfg.embed_dim, dtype_name, note=entry.note)

    torch.manual_seed(cfg.seed)
    mixer = entry.build(cfg.embed_dim).to(device=device, dtype=dtype).train()
    x = torch.randn(batch, T, cfg.embed_dim, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)

    # A tiny call first: one-time lazy initialisation (thread pools, kernel caches) is not the op's memory.
    small = x.detach()[:1, : min(T, 8)].clone().requires_grad_(True)
    y_small, _, _ = _fwd_bwd(mixer, small, torch.ones_like(small), device, check_name=entry.name)
    check_finite(entry.name, y_small, small.grad)
    del y_small, small
    mixer.zero_grad(set_to_none=True)  # else the probe's baseline holds parameter grads the step then frees

    probe = _PeakMemory(device)
    probe.start()
    y, _, _ = _fwd_bwd(mixer, x, grad, device, check_name=entry.name)
    peak = probe.stop()
    check_finite(entry.name, y, x.grad)  # after the probe: the check's own temporaries are not the op's
    del y
    result.peak_mem_mb = peak / 2**20

    for _ in range(cfg.warmup):
        _fwd_bwd(mixer, x, grad, device)
    fwd, total = [], []
    for _ in range(max(1, cfg.repeats)):
        _, f, t = _fwd_bwd(mixer, x, grad, device)
        fwd.append(f)
        total.append(t)
    result.repeats = len(total)
    result.fwd_ms = statistics.median(fwd) * 1e3
    result.fwd_bwd_ms = statistics.median(total) * 1e3
    result.fwd_bwd_ms_min = min(total) * 1e3
    result.fwd_bwd_ms_max = max(total) * 1e3
    result.tokens_per_s = batch * T / statistics.median(total)
    return result


def _failed(entry: MixerEntry, T: int, cfg: MixerBenchConfig, status: str) -> PointResult:
    return PointResult(entry.name, entry.causal, T, max(1, cfg.token_budget // T), cfg.embed_dim,
                       cfg.resolved_dtype(), status=status, note=entry.note)


def _run_isolated(entry: MixerEntry, T: int, cfg: MixerBenchConfig) -> PointResult:
    """The same point in a fresh interpreter (registry entries only: the child looks the entry up by name)."""
    job = json.dumps({"entry": entry.name, "T": T, "cfg": asdict(cfg)})
    cmd = [sys.executable, "-m", "benchmarks.mixers", "--worker", job]
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=cfg.point_timeout)
    except subprocess.TimeoutExpired:
        return _failed(entry, T, cfg, f"error: timed out after {cfg.point_timeout:.0f}s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            data = json.loads(line[len(RESULT_PREFIX):])
            return PointResult(**data)
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return _failed(entry, T, cfg, f"error: worker exited with code {proc.returncode}: {tail[:200]}")


def run_point(entry: MixerEntry, T: int, cfg: MixerBenchConfig, strict: bool = False) -> PointResult:
    """One point, never raising for a bad mixer unless ``strict``: the row is marked failed instead."""
    isolated = cfg.isolate and cfg.resolved_device().type == "cpu" and _is_registered(entry)
    if isolated:
        result = _run_isolated(entry, T, cfg)
        if strict and not result.ok:
            raise MixerCheckError(result.status)
        return result
    try:
        return measure_point(entry, T, cfg)
    except MixerCheckError as err:
        if strict:
            raise
        return _failed(entry, T, cfg, f"failed: {err}")
    except Exception as err:  # e.g. out of memory, unsupported shape: report it, go on with the other rows
        if strict:
            raise
        return _failed(entry, T, cfg, f"error: {type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}")
    finally:
        gc.collect()
        if cfg.resolved_device().type == "cuda":
            torch.cuda.empty_cache()


def _is_registered(entry: MixerEntry) -> bool:
    try:
        return registry.get(entry.name) == entry
    except KeyError:
        return False


# ----------------------------------------------------------------------------------------------- whole sweep

def add_ratios(rows: list[PointResult], baseline: str) -> None:
    """time/memory of each row divided by the baseline mixer's at the same T (same run, same machine)."""
    base = {r.T: r for r in rows if r.mixer == baseline and r.ok}
    for r in rows:
        b = base.get(r.T)
        if not r.ok or b is None:
            r.time_ratio = r.mem_ratio = None
            continue
        r.time_ratio = r.fwd_bwd_ms / b.fwd_bwd_ms if b.fwd_bwd_ms else None
        r.mem_ratio = r.peak_mem_mb / b.peak_mem_mb if b.peak_mem_mb else None


def run_mixer_benchmark(entries: list[MixerEntry], cfg: MixerBenchConfig, baseline: str | None = None,
                        strict: bool = False, log: Callable[[str], None] | None = print) -> dict:
    """Every (entry, T) point; returns {"rows", "env", "memory_method", "config", "baseline", "seconds"}."""
    device = cfg.resolved_device()
    baseline = baseline or (entries[0].name if entries else registry.BASELINE)
    isolate = cfg.isolate and device.type == "cpu"
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = {"env": environment(device), "memory_method": memory_method(device, isolate),
           "config": asdict(cfg) | {"dtype": cfg.resolved_dtype(), "device": str(device)}, "baseline": baseline}
    start = time.perf_counter()
    rows: list[PointResult] = []
    # T outer, mixers inner: a row and the baseline it is divided by are measured seconds apart, so a change
    # in background load during the sweep shifts both rather than skewing the ratio.
    for T in cfg.lengths:
        for entry in entries:
            t0 = time.perf_counter()
            row = run_point(entry, T, cfg, strict=strict)
            rows.append(row)
            if log:
                what = f"{row.fwd_bwd_ms:9.2f} ms  {row.peak_mem_mb:8.1f} MB" if row.ok else row.status.upper()
                log(f"  {entry.name:<24} T={T:<5} B={row.batch:<4} {what}  ({time.perf_counter() - t0:.1f}s)")
    order = {e.name: i for i, e in enumerate(entries)}
    rows.sort(key=lambda r: (order[r.mixer], r.T))
    add_ratios(rows, baseline)
    out["rows"] = rows
    out["seconds"] = time.perf_counter() - start
    return out


def scaling(rows: list[PointResult], ref_T: int | None = None) -> list[dict]:
    """Per mixer: time and peak memory per token at its longest T over the same at ``ref_T`` (default: the
    shortest T measured). 1.0 is linear cost in T; self-attention's time grows toward T_max / ref_T."""
    out = []
    for name in dict.fromkeys(r.mixer for r in rows):
        ok = {r.T: r for r in rows if r.mixer == name and r.ok}
        if len(ok) < 2:
            continue
        t_ref = ref_T if ref_T in ok else min(ok)
        t_max = max(ok)
        if t_max == t_ref:
            continue
        a, b = ok[t_ref], ok[t_max]
        per_token = {key: (getattr(b, key) / (b.batch * b.T)) / (getattr(a, key) / (a.batch * a.T))
                     for key in ("fwd_bwd_ms", "peak_mem_mb") if getattr(a, key) and getattr(b, key)}
        out.append({"mixer": name, "T_ref": t_ref, "T_max": t_max, "time_per_token_x": per_token.get("fwd_bwd_ms"),
                    "mem_per_token_x": per_token.get("peak_mem_mb")})
    return out


def format_scaling(items: list[dict]) -> str:
    header = ["mixer", "T_ref", "T_max", "time/token x", "mem/token x"]
    lines = [[i["mixer"], str(i["T_ref"]), str(i["T_max"]), _fmt(i["time_per_token_x"], ".2f"),
              _fmt(i["mem_per_token_x"], ".2f")] for i in items]
    widths = [max(len(h), *(len(line[k]) for line in lines)) if lines else len(h) for k, h in enumerate(header)]
    render = lambda cells: "  ".join(c.ljust(w) if k == 0 else c.rjust(w)  # noqa: E731
                                     for k, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([render(header), "  ".join("-" * w for w in widths), *(render(line) for line in lines)])


def _fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(rows: list[PointResult]) -> str:
    """Plain aligned text: one line per (mixer, T); failed points say why instead of giving numbers."""
    header = ["mixer", "T", "batch", "fwd ms", "fwd+bwd ms", "(min-max)", "time x", "peak MB", "mem x", "status"]
    lines = []
    for r in rows:
        spread = f"{r.fwd_bwd_ms_min:.1f}-{r.fwd_bwd_ms_max:.1f}" if r.ok else "-"
        lines.append([r.mixer, str(r.T), str(r.batch), _fmt(r.fwd_ms, ".2f"), _fmt(r.fwd_bwd_ms, ".2f"), spread,
                      _fmt(r.time_ratio, ".2f"), _fmt(r.peak_mem_mb, ".1f"), _fmt(r.mem_ratio, ".2f"),
                      "ok" if r.ok else r.status.upper()])
    widths = [max(len(h), *(len(row[i]) for row in lines)) if lines else len(h) for i, h in enumerate(header)]
    left = {0, 9}

    def render(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([render(header), sep, *(render(line) for line in lines)])


# ----------------------------------------------------------------------------------------------- worker

def _worker(job_json: str) -> None:
    """Child side of :func:`_run_isolated`: measure one point, print it as one JSON line."""
    job = json.loads(job_json)
    data = job["cfg"]
    data["lengths"] = tuple(data["lengths"])
    cfg = MixerBenchConfig(**data)
    cfg.isolate = False
    entry = registry.get(job["entry"])
    result = run_point(entry, int(job["T"]), cfg)
    print(RESULT_PREFIX + json.dumps(asdict(result)), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="internal: one isolated benchmark point (use benchmarks.run)")
    parser.add_argument("--worker", required=True)
    _worker(parser.parse_args().worker)
