"""The benchmark harness on tiny settings: rows are well-formed, and a broken mixer is refused, not timed.

Nothing here asserts on speed; the numbers only have to exist, be finite and be positive.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import decoding, registry
from benchmarks import run as bench_run
from benchmarks.mixers import (
    MixerBenchConfig,
    MixerCheckError,
    format_table,
    measure_point,
    run_mixer_benchmark,
    run_point,
)
from benchmarks.registry import MixerEntry
from seqmix.mixers.base import TokenMixer

TINY = dict(lengths=(16, 32), embed_dim=32, token_budget=2048, repeats=1, warmup=0, device="cpu", isolate=False)


class NaNMixer(TokenMixer):
    """Right shape, wrong numbers: the kind of kernel bug that would otherwise look fast."""

    def __init__(self, embed_dim: int, causal: bool = False, layer_idx: int = 0):
        super().__init__(embed_dim, causal, layer_idx)
        self.proj = torch.nn.Linear(embed_dim, embed_dim)

    def forward(self, x, key_padding_mask=None, state=None):
        return self.proj(x) * float("nan")


class ShortMixer(NaNMixer):
    """Finite numbers, wrong shape (drops the last step)."""

    def forward(self, x, key_padding_mask=None, state=None):
        return self.proj(x)[:, :-1]


NAN = MixerEntry("broken_nan", lambda d, causal: NaNMixer(d, causal), note="test: returns NaN")
SHORT = MixerEntry("broken_shape", lambda d, causal: ShortMixer(d, causal), note="test: wrong shape")


def _assert_good(row) -> None:
    assert row.ok, row.status
    for value in (row.fwd_ms, row.fwd_bwd_ms, row.peak_mem_mb, row.tokens_per_s):
        assert value is not None and math.isfinite(value) and value > 0
    assert row.batch == 2048 // row.T


def test_registry_baseline_first_and_entries_build():
    assert registry.ENTRIES[0].name == registry.BASELINE == "self_attention"
    names = [e.name for e in registry.ENTRIES]
    assert "self_attention_causal" in names and len(set(names)) == len(names)
    for entry in registry.ENTRIES:
        mixer = entry.build(32)
        assert isinstance(mixer, TokenMixer) and mixer.causal == entry.causal
    assert [e.name for e in registry.select(["self_attention_causal"])] == ["self_attention", "self_attention_causal"]
    with pytest.raises(KeyError):
        registry.select(["no_such_mixer"])


def test_mixer_rows_finite_positive_with_ratios():
    res = run_mixer_benchmark(registry.ENTRIES, MixerBenchConfig(**TINY), log=None)
    rows = res["rows"]
    assert [(r.mixer, r.T) for r in rows] == [(e.name, t) for e in registry.ENTRIES for t in (16, 32)]
    for row in rows:
        _assert_good(row)
        assert row.time_ratio > 0 and row.mem_ratio > 0
    assert all(r.time_ratio == 1.0 for r in rows if r.mixer == registry.BASELINE)
    assert "peak RSS" in res["memory_method"] and res["env"]["torch"] == torch.__version__
    assert "self_attention_causal" in format_table(rows)


def test_isolated_subprocess_point():
    """The default CPU path: the point runs in a fresh interpreter and comes back as one JSON line."""
    cfg = MixerBenchConfig(**(TINY | {"isolate": True}))
    _assert_good(run_point(registry.ENTRIES[0], 16, cfg))


@pytest.mark.parametrize("entry, why", [(NAN, "NaN"), (SHORT, "shape")])
def test_broken_mixer_is_refused(entry, why):
    cfg = MixerBenchConfig(**TINY)
    with pytest.raises(MixerCheckError, match=why):
        measure_point(entry, 16, cfg)
    with pytest.raises(MixerCheckError):
        run_point(entry, 16, cfg, strict=True)
    res = run_mixer_benchmark([registry.ENTRIES[0], entry], cfg, log=None)
    bad = [r for r in res["rows"] if r.mixer == entry.name]
    assert len(bad) == 2
    for row in bad:
        assert row.status.startswith("failed") and why in row.status
        assert row.fwd_bwd_ms is None and row.peak_mem_mb is None and row.time_ratio is None
    for row in res["rows"]:
        if row.mixer == registry.BASELINE:
            _assert_good(row)  # one bad mixer does not take the others down
    assert "FAILED" in format_table(res["rows"])


def test_run_writes_files_and_fails_on_broken_mixer(tmp_path, monkeypatch):
    tiny = ["--only", "mixers", "--lengths", "16", "32", "--embed-dim", "32", "--token-budget", "2048",
            "--repeats", "1", "--warmup", "0", "--in-process", "--device", "cpu"]
    out = tmp_path / "ok"
    assert bench_run.main([*tiny, "--out", str(out)]) == 0
    for name in ("mixers.csv", "mixers.png", "results.json"):
        assert (out / name).stat().st_size > 0
    report = json.loads((out / "results.json").read_text())
    assert report["mixers"]["baseline"] == registry.BASELINE
    assert len(report["mixers"]["rows"]) == 2 * len(registry.ENTRIES)  # every entry at both lengths

    monkeypatch.setattr(registry, "ENTRIES", [*registry.ENTRIES, NAN])
    out = tmp_path / "broken"
    assert bench_run.main([*tiny, "--mixers", "broken_nan", "--out", str(out)]) == 1
    rows = json.loads((out / "results.json").read_text())["mixers"]["rows"]
    assert {r["mixer"] for r in rows if r["status"] != "ok"} == {"broken_nan"}


def test_decoding_without_checkpoint_skips_with_instructions(tmp_path):
    messages = []
    assert decoding.find_checkpoints(tmp_path) == []
    assert decoding.run_decoding_benchmark(runs_dir=tmp_path, log=messages.append) is None
    assert "experiment=multi30k_transformer_cpu" in messages[0]


def _fake_ckpt(path, task, model):
    path.parent.mkdir(parents=True)
    torch.save({"seqmix": {"config": {"task": {"name": task}, "model": {"name": model}}}}, path)


def test_find_checkpoints_newest_per_model_transformer_first(tmp_path):
    import os
    import time as _time

    now = _time.time()
    for k, (run, task, model) in enumerate([("a", "multi30k_ende", "lightconv_small"),
                                            ("b", "multi30k_ende", "lightconv_small"),
                                            ("c", "multi30k_ende", "transformer_small"),
                                            ("d", "toy_reverse", "talk_small")]):
        path = tmp_path / run / "checkpoints" / "best.ckpt"
        _fake_ckpt(path, task, model)
        os.utime(path, (now + k, now + k))
    (tmp_path / "e" / "checkpoints").mkdir(parents=True)
    (tmp_path / "e" / "checkpoints" / "best.ckpt").write_bytes(b"not a checkpoint")
    found = decoding.find_checkpoints(tmp_path)
    assert [p.parts[-3] for p in found] == ["c", "b"]


def test_decoding_speed_ratios_against_transformer_at_same_beam():
    def row(model, beam, speed):
        return decoding.DecodeResult(model, 1, beam, 10, 10 / speed, speed, speed, 30.0, "sig", 8000)

    rows = [row("lightconv_small", 1, 300), row("transformer_small", 1, 200), row("transformer_small", 5, 40),
            row("lightconv_small", 5, 50)]
    decoding.add_speed_ratios(rows)
    assert [r.speed_ratio for r in rows] == [1.5, 1.0, 1.0, 1.25]
    table = decoding.format_table(rows)
    assert "lightconv_small" in table and "1.25" in table


def test_scaling_is_per_token_growth_against_reference_length():
    from benchmarks.mixers import PointResult, format_scaling, scaling

    def point(mixer, T, batch, ms, mb):
        return PointResult(mixer, False, T, batch, 32, "fp32", fwd_bwd_ms=ms, peak_mem_mb=mb)

    rows = [point("sa", 512, 4, 100.0, 10.0), point("sa", 2048, 1, 400.0, 40.0),
            point("conv", 512, 4, 50.0, 8.0), point("conv", 1024, 2, 50.0, 8.0), point("conv", 2048, 1, 60.0, 8.0),
            point("lonely", 512, 4, 1.0, 1.0)]
    items = {i["mixer"]: i for i in scaling(rows, ref_T=512)}
    assert set(items) == {"sa", "conv"}
    assert items["sa"]["time_per_token_x"] == pytest.approx(4.0) and items["sa"]["mem_per_token_x"] == pytest.approx(4.0)
    assert items["conv"]["T_max"] == 2048 and items["conv"]["time_per_token_x"] == pytest.approx(1.2)
    assert "time/token x" in format_scaling(list(items.values()))
