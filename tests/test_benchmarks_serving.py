"""benchmarks/serving.py on a tiny model and a tiny Multi30k-shaped corpus: without a checkpoint it trains one, then
measures seqmix eager / int8 and CTranslate2 float32 / int8 of that same checkpoint; the table, CSV and PNG hold a
row per variant whose ratios are its sentences/s over CTranslate2 float32's of the same run, and whose agreement
column compares its outputs with seqmix eager's. Timings themselves are not checked."""

from __future__ import annotations

import csv
from dataclasses import replace

import pytest
import torch

from benchmarks import run as bench_run
from benchmarks import serving
from tests.benchmark_fixtures import VAL_DE, VAL_EN, one_thread, write_val  # noqa: F401 - one_thread: autouse

TINY = ("model.embed_dim=16", "model.encoder.layers=1", "model.decoder.layers=1", "model.encoder.ffn_dim=32",
        "model.decoder.ffn_dim=32", "model.encoder.heads=2", "model.decoder.heads=2",
        "model.decoder.cross_attention_heads=2", "model.max_source_positions=64", "model.max_target_positions=64")


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQMIX_LOG_DIR", str(tmp_path / "no_runs"))  # no run of the developer's is picked up
    folder = write_val(tmp_path / "multi30k")
    (folder / "train.en").write_text("".join(s + "\n" for s in VAL_EN * 4), encoding="utf-8")
    (folder / "train.de").write_text("".join(s + "\n" for s in VAL_DE * 4), encoding="utf-8")
    return folder


def settings(data_dir, **kw) -> serving.Settings:
    return replace(serving.Settings(data_dir=str(data_dir), train_seconds=1.0, vocab_size=120, threads=1, warmup=2,
                                    model_overrides=TINY), **kw)


def read_rows(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_it_trains_a_model_and_compares_four_engines_with_ratios_from_the_measured_numbers(data_dir, tmp_path,
                                                                                           capsys):
    out = tmp_path / "out"
    out.mkdir()
    result, failed = serving.section(settings(data_dir), torch.device("cpu"), out)
    assert failed == []
    printed = capsys.readouterr().out
    assert "trained transformer_small" in printed and "x ct2 fp32" in printed
    rows = read_rows(out / "serving.csv")
    assert [(r["engine"], r["compute"]) for r in rows] == [("seqmix", "float32"), ("seqmix", "int8"),
                                                          ("ctranslate2", "float32"), ("ctranslate2", "int8")]
    assert (out / "serving.png").stat().st_size > 0
    assert {r["ckpt"] for r in rows} == {str(out / "serving_model.ckpt")}  # one model for all four
    base = float(rows[2]["sentences_per_s"])
    for r in rows:
        assert r["status"] == "ok" and r["beam"] == "5" and r["threads"] == "1"
        assert int(r["sentences"]) == len(VAL_EN)
        assert float(r["sentences_per_s"]) == pytest.approx(int(r["sentences"]) / float(r["seconds"]))
        assert float(r["speed_ratio"]) == pytest.approx(float(r["sentences_per_s"]) / base)
        assert 0.0 <= float(r["bleu"]) <= 100.0 and 0.0 <= float(r["same_as_eager"]) <= 1.0
    assert float(rows[2]["speed_ratio"]) == 1.0 and float(rows[0]["same_as_eager"]) == 1.0
    assert result["rows"][0]["model"] == "transformer_small"


def test_a_given_checkpoint_is_measured_and_a_failed_variant_is_a_row(data_dir, tmp_path, monkeypatch):
    first = tmp_path / "first"
    first.mkdir()
    ckpt = serving.train_quick_model(settings(data_dir), first, log=lambda *_: None)
    out = tmp_path / "out"

    def broken(*args, **kwargs):
        raise RuntimeError("no int8 kernels here")

    real = serving.measure_ctranslate2
    monkeypatch.setattr(serving, "measure_ctranslate2",
                        lambda ld, s, folder, compute: broken() if compute == "int8" else real(ld, s, folder, compute))
    code = serving.main(["--checkpoint", str(ckpt), "--data-dir", str(data_dir), "--threads", "1", "--limit", "5",
                         "--out", str(out)])
    assert code == 1  # a failed variant fails the run, after the files are written
    rows = read_rows(out / "serving.csv")
    assert {r["ckpt"] for r in rows} == {str(ckpt)} and [int(r["sentences"] or 0) for r in rows] == [5, 5, 5, 0]
    assert rows[3]["status"].startswith("ERROR: RuntimeError: no int8 kernels") and rows[3]["speed_ratio"] == ""


def test_the_section_is_part_of_make_bench():
    assert bench_run.SECTIONS["serving"] is serving


@pytest.mark.slow
def test_on_the_real_multi30k_files(multi30k_dir, tmp_path, monkeypatch):
    """The shared data's gzipped train/val files, a tiny model trained for a second, ten val sentences."""
    monkeypatch.setenv("SEQMIX_LOG_DIR", str(tmp_path / "no_runs"))
    s = replace(settings(multi30k_dir), limit=10, vocab_size=1000)
    result, failed = serving.section(s, torch.device("cpu"), tmp_path)
    assert failed == [] and [r["sentences"] for r in result["rows"]] == [10] * 4
    assert result["rows"][2]["speed_ratio"] == 1.0
