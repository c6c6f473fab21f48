"""Data benchmark: the synthetic corpora are what the benchmark says they are, and a tiny end-to-end run measures
both paths in fresh processes, on the same batches, with the sharing figures read from the kernel. No speed is
asserted (timing belongs in `make bench`)."""

from __future__ import annotations

import csv
import gzip
import json
import math
import mmap
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
    src_sentences = set(_gz(multi30k_dir / "train.en.gz"))
    pair_of = dict(zip(_gz(multi30k_dir / "train.en.gz"), _gz(multi30k_dir / "train.de.gz")))
    # The first joined Multi30k sentence of each line is a real pair, its German side starts the German line.
    for e, d in zip(en[:20], de[:20]):
        assert any(e.startswith(s + " ") and d.startswith(pair_of[s] + " ") for s in src_sentences)
    again = data.write_parallel_corpus(multi30k_dir, tmp_path / "b", 120, seed=3)
    other = data.write_parallel_corpus(multi30k_dir, tmp_path / "c", 120, seed=4)
    assert (again / "train.de").read_bytes() == (out / "train.de").read_bytes()
    assert (other / "train.de").read_bytes() != (out / "train.de").read_bytes()
    assert (out / "val.en").read_text(encoding="utf-8").split("\n")[:-1] == _gz(multi30k_dir / "val.en.gz")


def test_lm_stream_resamples_wikitext2_lines_to_the_token_count(shared_data, tmp_path):
    out = data.write_text_corpus(shared_data / "wikitext-2", tmp_path, 50_000, seed=1)
    lines = (out / "train.txt").read_text(encoding="utf-8").split("\n")[:-1]
    source = set((shared_data / "wikitext-2" / "train.txt").read_text(encoding="utf-8").split("\n"))
    assert set(lines) <= source
    tokens = sum(len(line.split()) + 1 for line in lines)
    assert 50_000 <= tokens < 50_000 + 20_000 * 200  # stops after the block that crossed the count


def test_store_mappings_are_read_from_smaps(tmp_path):
    store = tmp_path / "x.store"
    store.mkdir()
    (store / "a.bin").write_bytes(b"\1" * (64 * 4096))
    (tmp_path / "other.bin").write_bytes(b"\1" * (64 * 4096))
    with open(store / "a.bin", "rb") as f, open(tmp_path / "other.bin", "rb") as g:
        a, b = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), mmap.mmap(g.fileno(), 0, access=mmap.ACCESS_READ)
        assert sum(a[i] for i in range(0, len(a), 4096)) + sum(b[i] for i in range(0, len(b), 4096)) == 128
        rss, pss = data._store_mappings_mb(".store/")
        a.close(), b.close()
    assert rss == pytest.approx(0.25, abs=0.01)  # the store's 64 pages only, not the other file's
    assert 0 < pss <= rss


def test_targets_compare_the_largest_store_row():
    small = data.DataRow("translation", 10, "store", preprocess_s=900.0, preprocess_peak_gb=1, startup_s=1,
                         data_anon_mb=10, data_file_mb=5, loader_x=100)
    big = data.DataRow("translation", 20, "store", preprocess_s=100.0, preprocess_peak_gb=5, startup_s=1,
                       data_anon_mb=900, data_file_mb=200, loader_x=10)
    checks = {t["what"]: t for t in data.targets([small, big, data.DataRow("lm", 99, "store")])}
    assert {t["size"] for t in checks.values()} == {20}
    assert checks["preprocessing time (s)"]["met"] and not checks["preprocessing peak RSS (GB)"]["met"]
    assert not checks["RSS grown by data, anon + file (GB)"]["met"]  # 1100 MB > 1 GB
    assert not checks["loader batches/s over recipe steps/s"]["met"]


def test_tiny_run_measures_both_paths_on_the_same_batches(tmp_path, shared_data):
    out = tmp_path / "out"
    code = bench_run.main(["--only", "data", "--data-sizes", "1500", "--legacy-sizes", "1500", "--lm-tokens",
                           "40000", "--data-batches", "5", "--synthetic", "--data-work", str(tmp_path / "work"),
                           "--out", str(out)])
    assert code == 0
    report = json.loads((out / "results.json").read_text())["data"]
    rows = {(r["corpus"], r["path"]): r for r in report["rows"]}
    assert set(rows) == {("translation", "store"), ("translation", "legacy"), ("lm", "store")}
    store, legacy, lm = rows["translation", "store"], rows["translation", "legacy"], rows["lm", "store"]
    assert store["examples"] == legacy["examples"] == 1500
    assert store["first_batch"] == legacy["first_batch"] != ""  # same tokenizer, same sampler, same batch
    for r in (store, legacy, lm):
        assert r["status"] == "ok"
        for key in ("preprocess_s", "preprocess_peak_gb", "startup_s", "startup_peak_gb", "batches_per_s_w0",
                    "batches_per_s_w2", "loader_x"):
            assert r[key] is not None and math.isfinite(r[key]) and r[key] > 0, key
        assert r["startup_peak_gb"] < 8  # the child's own peak, not the parent's inherited one
        assert r["loader_x"] == pytest.approx(r["batches_per_s_w0"] / report["info"]["recipe_steps_per_s"])
    assert lm["examples"] > 0 and lm["size"] == 40_000
    [ratio] = report["ratios"]
    assert ratio["same_batches"] and ratio["startup_s"] == pytest.approx(legacy["startup_s"] / store["startup_s"])
    [share] = report["sharing"]
    assert len(share["rss_mb"]) == len(share["pss_mb"]) == 2 and share["store_mb"] > 0
    assert all(0 < p <= r for p, r in zip(share["pss_mb"], share["rss_mb"]))
    assert {t["size"] for t in report["targets"]} == {1500}
    with open(out / "data.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
    assert (out / "data.png").stat().st_size > 0
    assert not list((tmp_path / "work").glob("wmt-like-*")) and not list((tmp_path / "work").glob("cache-*"))
