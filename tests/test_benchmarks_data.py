"""Data benchmark: the synthetic corpora are what the benchmark says they are, and a tiny end-to-end run measures the
token stores in fresh processes (preprocess.py, start-up, loader). No speed is asserted (timing belongs in make bench)."""

from __future__ import annotations

import csv
import gzip
import json
import math
from pathlib import Path

import pytest

from benchmarks import data
from benchmarks import run as bench_run


def _gz(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def test_parallel_corpus_joins_multi30k_pairs_to_wmt_length(multi30k_dir, tmp_path):
    out = data.write_parallel_corpus(multi30k_dir, tmp_path / "a", 120, seed=3)
    en, de = ((out / f"train.{lang}").read_text(encoding="utf-8").split("\n")[:-1] for lang in ("en", "de"))
    assert len(en) == len(de) == 120
    assert all(len(line.split()) >= data.MIN_WORDS for line in en)
    pair_of = dict(zip(_gz(multi30k_dir / "train.en.gz"), _gz(multi30k_dir / "train.de.gz")))
    # The first joined Multi30k sentence of each line is a real pair: its German side starts the German line.
    for e, d in zip(en[:20], de[:20]):
        assert any(e.startswith(s + " ") and d.startswith(pair_of[s] + " ") for s in pair_of)
    again = data.write_parallel_corpus(multi30k_dir, tmp_path / "b", 120, seed=3)
    other = data.write_parallel_corpus(multi30k_dir, tmp_path / "c", 120, seed=4)
    assert (again / "train.de").read_bytes() == (out / "train.de").read_bytes()
    assert (other / "train.de").read_bytes() != (out / "train.de").read_bytes()
    assert (out / "val.en").read_text(encoding="utf-8").split("\n")[:-1] == _gz(multi30k_dir / "val.en.gz")


def test_lm_stream_resamples_wikitext2_lines_to_the_token_count(shared_data, tmp_path):
    out = data.write_text_corpus(shared_data / "wikitext-2", tmp_path, 50_000, seed=1)
    lines = (out / "train.txt").read_text(encoding="utf-8").split("\n")[:-1]
    assert set(lines) <= set((shared_data / "wikitext-2" / "train.txt").read_text(encoding="utf-8").split("\n"))
    tokens = sum(len(line.split()) + 1 for line in lines)
    assert 50_000 <= tokens < 50_000 + 20_000 * 200  # stops after the block that crossed the count


def test_tiny_run_measures_the_stores_in_fresh_processes(tmp_path, shared_data):
    s = data.Settings(sizes=(1500,), lm_tokens=40_000, batches=5, shared_dir=str(shared_data), work=str(tmp_path / "w"))
    assert bench_run.main(["--only", "data", "--out", str(tmp_path / "out")], {"data": s}) == 0
    report = json.loads((tmp_path / "out" / "results.json").read_text())["data"]
    rows = {r["corpus"]: r for r in report["rows"]}
    assert set(rows) == {"translation", "lm"} and rows["translation"]["examples"] == 1500
    assert rows["lm"]["examples"] > 0 and rows["lm"]["size"] == 40_000
    for r in rows.values():
        assert r["status"] == "ok" and r["path"] == "store" and len(r["first_batch"]) == 16
        for key in ("preprocess_s", "preprocess_peak_gb", "startup_s", "startup_peak_gb", "batches_per_s_w0",
                    "batches_per_s_w2", "loader_x"):
            assert r[key] is not None and math.isfinite(r[key]) and r[key] > 0, key
        assert r["startup_peak_gb"] < 8 and r["startup_s"] > 0  # the child's own peak, not the parent's
        assert r["loader_x"] == pytest.approx(r["batches_per_s_w0"] / report["info"]["recipe_steps_per_s"])
    with open(tmp_path / "out" / "data.csv") as f:
        assert csv.DictReader(f).fieldnames == data.FIELDS.split()
    assert (tmp_path / "out" / "data.png").stat().st_size > 0
    assert not list((tmp_path / "w").glob("*-*"))  # corpora and stores deleted (keep=False)


def test_a_failing_preprocess_is_a_row_without_numbers(tmp_path):
    row = data.measure("translation", 10, ["task=no_such_task"], data.Settings(batches=1), None, log=lambda *_: None)
    assert row["status"].startswith("ERROR: exit") and row["preprocess_s"] is None and row["startup_s"] is None
