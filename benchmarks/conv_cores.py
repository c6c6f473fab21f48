"""The LightConv and DynamicConv cores (taps softmax, DynamicConv's tap projection, the convolution; forward+backward)
against fairseq's two PyTorch algorithms, re-implemented here from their description (not their code) in their (T, B, C)
layout: "unfold" (each position's K-window materialized, one bmm per (t, b, h)) and "expanded" (a (B·H, T, T) band
matrix per sequence). fairseq picks between them by length; the ratio column is over the faster of the two at each T.
A point is checked against seqmix's output before it is timed."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks import common
from benchmarks.plotting import line_panels
from seqmix.layers.banded import banded_conv

FIELDS = "core impl T batch padding_l status fwd_bwd_ms tokens_per_s speed_ratio note"
IMPLS = ("seqmix", "fairseq_unfold", "fairseq_expanded")


@dataclass
class Settings:
    lengths: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192)
    token_budget: int = 16384
    embed_dim: int = 512
    heads: int = 8
    kernel_size: int = 31
    padding_l: int | None = None  # default K − 1 (decoder); K // 2 is the encoder's
    repeats: int = 5
    max_band_gb: float = 2.0  # fairseq_expanded's (B·H, T, T) band above this: skipped


QUICK = {"lengths": (128, 512), "repeats": 2}


def fairseq_unfold(x_tbc: torch.Tensor, w: torch.Tensor, padding_l: int, heads: int) -> torch.Tensor:
    """Every position's K-window as a (G, K) matrix times its (K, 1) taps; w: (H, K) or (T, B, H, K)."""
    length, bsz, channels = x_tbc.shape
    k = w.shape[-1]
    padded = F.pad(x_tbc, (0, 0, 0, 0, padding_l, k - 1 - padding_l))
    windows = padded.unfold(0, k, 1).reshape(length * bsz * heads, channels // heads, k)  # copies K× the input
    taps = w.expand(length, bsz, heads, k).reshape(length * bsz * heads, k, 1)
    return torch.bmm(windows, taps).view(length, bsz, channels)


def fairseq_expanded(x_tbc: torch.Tensor, w: torch.Tensor, padding_l: int, heads: int) -> torch.Tensor:
    """A (T, T) band per (sequence, head) holding each position's taps on its row, times the (T, G) sequence."""
    length, bsz, channels = x_tbc.shape
    k = w.shape[-1]
    taps = w.expand(length, bsz, heads, k).permute(1, 2, 0, 3).reshape(bsz * heads, length, k)
    band = taps.new_zeros(bsz * heads, length, length + k - 1)
    band.as_strided((bsz * heads, length, k), (length * (length + k - 1), length + k, 1)).copy_(taps)
    band = band[:, :, padding_l:padding_l + length]
    seq = x_tbc.reshape(length, bsz * heads, channels // heads).transpose(0, 1)
    return torch.bmm(band, seq).transpose(0, 1).reshape(length, bsz, channels)


def make_step(core: str, impl: str, x: torch.Tensor, params: dict, s: Settings, padding_l: int):
    """A closure computing the core on ``x`` ((B, T, C) for seqmix, (T, B, C) otherwise) and backpropagating ones."""
    heads, k = s.heads, s.kernel_size

    def taps():
        if core == "lightconv":
            return torch.softmax(params["weight"], dim=-1)
        w = torch.softmax(F.linear(x, params["proj"]).unflatten(-1, (heads, k)), dim=-1)
        return w

    def run():
        if impl == "seqmix":
            return banded_conv(x, taps(), padding_l)
        fn = fairseq_unfold if impl == "fairseq_unfold" else fairseq_expanded
        return fn(x, taps(), padding_l, heads)

    def step():
        x.grad = None
        y = run()
        y.backward(params["grad"] if impl == "seqmix" else params["grad"].transpose(0, 1))
        return y
    return step


def measure(core: str, T: int, s: Settings) -> list[dict]:
    padding_l = s.kernel_size - 1 if s.padding_l is None else s.padding_l
    bsz = max(1, s.token_budget // T)
    g = torch.Generator().manual_seed(T)
    x_btc = torch.randn(bsz, T, s.embed_dim, generator=g)
    params = {"weight": torch.randn(s.heads, s.kernel_size, generator=g, requires_grad=True),
              "proj": (torch.randn(s.heads * s.kernel_size, s.embed_dim, generator=g) / s.embed_dim ** 0.5).requires_grad_(),
              "grad": torch.randn(bsz, T, s.embed_dim, generator=g)}
    rows, reference = [], None
    for impl in IMPLS:
        row = common.new_row(FIELDS, core=core, impl=impl, T=T, batch=bsz, padding_l=padding_l, status="ok", note="")
        band_gb = bsz * s.heads * T * (T + s.kernel_size) * 4 / 2**30
        if impl == "fairseq_expanded" and band_gb > s.max_band_gb:
            rows.append(row | {"status": f"skipped: band {band_gb:.1f} GB"})
            continue
        x = (x_btc if impl == "seqmix" else x_btc.transpose(0, 1).contiguous()).clone().requires_grad_(True)
        step = make_step(core, impl, x, params, s, padding_l)
        y = step()
        y = y if impl == "seqmix" else y.transpose(0, 1)
        if reference is None:
            reference = y.detach()
        elif not torch.allclose(y, reference, rtol=1e-4, atol=1e-4):
            rows.append(row | {"status": "failed: differs from seqmix"})
            continue
        times = common.time_ms(step, s.repeats, 1, torch.device("cpu"))
        ms = statistics.median(times)
        rows.append(row | {"fwd_bwd_ms": ms, "tokens_per_s": bsz * T / ms * 1e3})
    best = min((r["fwd_bwd_ms"] for r in rows if r["impl"] != "seqmix" and r["fwd_bwd_ms"]), default=None)
    for r in rows:
        r["speed_ratio"] = best / r["fwd_bwd_ms"] if best and r["fwd_bwd_ms"] else None
    return rows


TABLE = [("core", "core", ""), ("impl", "impl", ""), ("T", "T", ""), ("batch", "batch", ""),
         ("fwd+bwd ms", "fwd_bwd_ms", ".1f"), ("tokens/s", "tokens_per_s", ",.0f"), ("speed x", "speed_ratio", ".2f"),
         ("status", lambda r: "ok" if common.ok(r) else r["status"].upper(), "")]


def section(s: Settings, device: torch.device, out: Path, log=print) -> tuple[dict, list[str]]:
    """CPU only (on CUDA the Triton kernels serve these cores; their comparison is the mixers section)."""
    env = common.environment(torch.device("cpu"))
    log(f"== conv cores: d={s.embed_dim}, H={s.heads}, K={s.kernel_size}, {s.token_budget} tokens/batch, fp32 on "
        f"{env['device_name']}, {env['torch_threads']} threads")
    rows = []
    for T in s.lengths:
        for core in ("lightconv", "dynamicconv"):
            rows += measure(core, T, s)
            log("  " + "  ".join(f"{r['core']} {r['impl']} T={T}: {common.cell(r['fwd_bwd_ms'], '.1f')} ms"
                                 for r in rows[-len(IMPLS):]))
    common.print_table("speed x: the faster fairseq algorithm's time over this row's, same T, this run", rows, TABLE)
    series = {f"{r['core']} {r['impl']}": [] for r in rows}
    for r in rows:
        if r["fwd_bwd_ms"]:
            series[f"{r['core']} {r['impl']}"].append((r["T"], r["fwd_bwd_ms"]))
    line_panels([("forward+backward per batch (ms)", series)], "sequence length T (batch = token budget // T)",
                out / "conv_cores.png", f"{env['device_name']}, fp32, d={s.embed_dim}, K={s.kernel_size}", xbase=2)
    res = {"env": env, "rows": common.write_csv(out / "conv_cores.csv", rows)}
    return res, [f"conv core {r['core']} {r['impl']} T={r['T']}: {r['status']}" for r in rows if r["status"].startswith("failed")]
