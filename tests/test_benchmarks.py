"""The mixer sweep on tiny settings: a row per group mixer and length, ratios against the baseline of the same run,
a wrong mixer refused (no numbers, exit status 1), the shared table/ratio helpers. No speed is asserted."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from benchmarks import common, mixers
from benchmarks import run as bench_run
from seqmix.config.mixer_group import mixer_names
from tests.benchmark_fixtures import (
    FastPathMixer,
    NaNMixer,
    ShortMixer,
    mixer_conf,
    one_thread,  # noqa: F401  (autouse fixture)
)

TINY = mixers.Settings(lengths=(16, 32), embed_dim=32, token_budget=2048, repeats=1, warmup=0, isolate=False)
CPU = torch.device("cpu")


def _assert_good(row: dict) -> None:
    assert row["status"] == "ok", row["status"]
    for key in ("fwd_ms", "fwd_bwd_ms", "peak_mem_mb", "tokens_per_s"):
        assert row[key] is not None and math.isfinite(row[key]) and row[key] > 0, key
    assert row["fwd_bwd_ms_min"] <= row["fwd_bwd_ms"] <= row["fwd_bwd_ms_max"]
    assert row["batch"] == 2048 // row["T"] and row["repeats"] == 1


def test_rows_come_from_the_mixer_group_baseline_first():
    names = [e[0] for e in mixers.entries(TINY)]
    assert names[:2] == ["self_attention", "self_attention_causal"]
    assert sorted(names[2:]) == sorted(n for n in mixer_names() if n != "self_attention")
    assert [e[0] for e in mixers.entries(replace(TINY, mixers=("talk",)))] == ["self_attention", "talk"]


def test_every_point_measured_with_ratios_against_the_baseline(tmp_path):
    res, failed = mixers.section(TINY, CPU, tmp_path, log=lambda *_: None)
    rows = res["rows"]
    assert failed == [] and res["baseline"] == "self_attention" and res["env"]["torch"] == torch.__version__
    assert [(r["mixer"], r["T"]) for r in rows] == [(e[0], t) for e in mixers.entries(TINY) for t in (16, 32)]
    base = {r["T"]: r for r in rows if r["mixer"] == "self_attention"}
    for r in rows:
        _assert_good(r)
        assert r["time_ratio"] == pytest.approx(r["fwd_bwd_ms"] / base[r["T"]]["fwd_bwd_ms"])
        assert r["mem_ratio"] == pytest.approx(r["peak_mem_mb"] / base[r["T"]]["peak_mem_mb"])
    assert any("K=31" in r["note"] for r in rows) and "peak RSS" in res["memory_method"]
    with open(tmp_path / "mixers.csv") as f:
        assert list(csv.DictReader(f).fieldnames) == mixers.FIELDS.split()
    assert (tmp_path / "mixers.png").stat().st_size > 0


def test_isolated_point_runs_in_a_fresh_process():
    row = mixers.run_point("talk", "talk", False, 16, replace(TINY, isolate=True), CPU)
    _assert_good(row)
    assert row["note"].startswith("TaLK")


@pytest.mark.parametrize("cls, why", [(NaNMixer, "NaN"), (ShortMixer, "shape"), (FastPathMixer, "reference path")])
def test_a_wrong_mixer_is_refused_before_timing(tmp_path, cls, why):
    s = replace(TINY, conf_dirs=(str(mixer_conf(tmp_path, broken=cls)),))
    with pytest.raises(mixers.MixerCheckError, match=why):
        mixers.measure_point("broken", "broken", False, 16, s, CPU)
    row = mixers.run_point("broken", "broken", False, 16, s, CPU)
    assert row["status"].startswith("failed") and why in row["status"]
    assert row["fwd_bwd_ms"] is None and row["peak_mem_mb"] is None


def test_run_exits_1_on_a_wrong_mixer_and_writes_every_file(tmp_path):
    s = replace(TINY, lengths=(16,), conf_dirs=(str(mixer_conf(tmp_path / "conf", broken_nan=NaNMixer)),),
                mixers=("broken_nan",))
    assert bench_run.main(["--only", "mixers", "--out", str(tmp_path / "out")], {"mixers": s}) == 1
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    rows = report["mixers"]["rows"]
    assert [(r["mixer"], r["status"][:6]) for r in rows] == [("self_attention", "ok"), ("broken_nan", "failed")]
    assert rows[0]["time_ratio"] == 1.0 and rows[1]["time_ratio"] is None  # a refused row gets no ratio
    assert report["mixers"]["settings"]["mixers"] == ["broken_nan"] and "torch" in report["environment"]
    for name in ("mixers.csv", "mixers.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0


def test_a_section_that_raises_is_listed_and_the_others_are_still_run_and_written(tmp_path, monkeypatch):
    def raising(s, device, out):
        raise RuntimeError("the recipe's training step failed")

    first = SimpleNamespace(Settings=mixers.Settings, QUICK={}, section=raising)
    monkeypatch.setattr(bench_run, "SECTIONS", {"conv_cores": first, "mixers": mixers})  # the raising one first
    s = replace(TINY, lengths=(16,), mixers=("lightconv",))
    assert bench_run.main(["--only", "conv_cores", "mixers", "--out", str(tmp_path / "out")],
                          {"mixers": s, "conv_cores": s}) == 1
    report = json.loads((tmp_path / "out" / "results.json").read_text())
    assert report["conv_cores"]["error"] == "conv_cores: RuntimeError: the recipe's training step failed"
    assert [(r["mixer"], r["status"]) for r in report["mixers"]["rows"]] == [("self_attention", "ok"), ("lightconv", "ok")]
    assert (tmp_path / "out" / "mixers.csv").stat().st_size > 0


def test_ratios_against_the_first_good_base_of_the_same_group_only():
    rows = [{"g": 1, "base": False, "v": 6.0}, {"g": 1, "base": True, "v": 3.0}, {"g": 1, "base": True, "v": 1.0},
            {"g": 2, "base": False, "v": 5.0}, {"g": 3, "base": True, "v": 2.0, "status": "failed: x"},
            {"g": 3, "base": False, "v": 4.0}, {"g": 1, "base": False, "v": 9.0, "status": "error: y"}]
    common.add_ratios(rows, lambda r: r["g"], lambda r: r["base"], x="v", half=lambda r: r["v"] / 2)
    assert [r["x"] for r in rows] == [2.0, 1.0, 1 / 3, None, None, None, None]
    assert rows[0]["half"] == 2.0


def test_table_prints_every_row_with_dashes_for_missing_numbers(capsys):
    common.print_table("title", [{"a": "x", "b": 1.234}, {"a": "y", "b": None}], [("A", "a", ""), ("B", "b", ".1f")])
    out = capsys.readouterr().out
    assert "title" in out and "1.2" in out and "-" in out.splitlines()[-1] and "y" in out
