"""Non-autoregressive decoding benchmark: DisCo / CMLM next to their autoregressive teacher at batch size 1 and at
full batches, on tiny randomly-initialized checkpoints built from the real Multi30k recipes (no speed asserted)."""

from __future__ import annotations

import json
import math
import os
import time

import pytest
import torch

from benchmarks import decoding
from benchmarks import run as bench_run
from seqmix.errors import SeqmixError
from tests.benchmark_fixtures import (
    one_thread,  # noqa: F401  (autouse fixture)
    save_tiny_checkpoint,
    tiny_tokenizer,
    write_val,
)

MAX_ITER = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs/{teacher,disco,cmlm,old_disco}/checkpoints/best.ckpt (old_disco older than disco) and a 12-sentence val."""
    root = tmp_path_factory.mktemp("nat_bench")
    tok = tiny_tokenizer()
    nat = [f"task.nat.max_iterations={MAX_ITER}"]
    paths = {}
    now = time.time()
    for k, (run, exp, extra) in enumerate([("old_disco", "multi30k_disco_cpu", nat),
                                           ("teacher", "multi30k_transformer_cpu", []),
                                           ("disco", "multi30k_disco_cpu", nat), ("cmlm", "multi30k_cmlm_cpu", nat)]):
        paths[run] = save_tiny_checkpoint(root / "runs" / run / "checkpoints" / "best.ckpt", exp, tok, extra, seed=k)
        os.utime(paths[run], (now + k, now + k))
    return {"root": root, "runs": root / "runs", "data": write_val(root / "multi30k"), **paths}


def _fake_ckpt(path, task, model, nat=False):
    path.parent.mkdir(parents=True)
    cfg = {"task": {"name": task, "module": {"_target_": "seqmix.tasks.TranslationTask"}},
           "model": {"name": model, "_target_": "seqmix.models.EncoderDecoder"}}
    if nat:
        cfg["task"]["module"]["_target_"] = "seqmix.tasks.nat_translation.NonAutoregressiveTranslationTask"
        cfg["model"]["_target_"] = "seqmix.models.nat.DisCoTransformer"
    torch.save({"seqmix": {"config": cfg}}, path)


def test_discovery_keeps_nat_out_of_the_autoregressive_list(tmp_path):
    now = time.time()
    for k, (run, model, nat) in enumerate([("a", "cmlm_small", True), ("b", "disco_small", True),
                                           ("c", "disco_small", True), ("d", "transformer_small", False)]):
        path = tmp_path / ("one" if k < 2 else "two") / run / "checkpoints" / "best.ckpt"
        _fake_ckpt(path, "multi30k_ende", model, nat)
        os.utime(path, (now + k, now + k))
    dirs = [tmp_path / "one", tmp_path / "two"]
    assert [p.parts[-3] for p in decoding.find_checkpoints(dirs, nat=True)] == ["c", "a"]  # newest DisCo first
    assert [p.parts[-3] for p in decoding.find_checkpoints(dirs)] == ["d"]
    assert decoding.find_checkpoints(tmp_path / "one") == []  # a single folder still works
    assert decoding.default_teacher(dirs).parts[-3] == "d"


def test_nat_section_skips_with_instructions(tmp_path):
    messages = []
    assert decoding.run_nat_benchmark(runs_dir=tmp_path, log=messages.append) is None
    assert "experiment=multi30k_disco_cpu" in messages[0] and "distill_dir" in messages[0]


def _row(model, role, max_sentences, speed, sentences=10, decoder="beam"):
    return decoding.DecodeResult(model, 1, 5 if role == "teacher" else None, sentences, sentences / speed, speed,
                                 speed, 30.0, "sig", 8000, max_sentences=max_sentences, role=role, decoder=decoder)


def test_ratios_are_against_the_teacher_with_the_same_batching():
    rows = [_row("disco_small", "nat", None, 600, decoder="easy_first"), _row("transformer_small", "teacher", 1, 10),
            _row("cmlm_small", "nat", 1, 25, decoder="mask_predict"), _row("transformer_small", "teacher", None, 200),
            _row("disco_small", "nat", 1, 40, decoder="easy_first")]
    for r, cpu in zip(rows, [1.0, 2.0, None, 4.0, 0.5]):
        r.cpu_seconds = cpu
    decoding.add_teacher_ratios(rows)
    assert [r.speed_ratio for r in rows] == [3.0, 1.0, 2.5, 1.0, 4.0]
    assert [r.cpu_speed_ratio for r in rows] == [4.0, 1.0, None, 1.0, 4.0]  # sentences per CPU second, same batching
    alone = [_row("disco_small", "nat", 1, 40)]
    decoding.add_teacher_ratios(alone)
    assert alone[0].speed_ratio is None
    with pytest.raises(ValueError, match="same sentences"):
        decoding.add_teacher_ratios([_row("t", "teacher", 1, 10), _row("d", "nat", 1, 40, sentences=7)])


def test_batch1_decodes_one_sentence_per_call(runs):
    loaded = decoding.load_checkpoint_and_data(runs["disco"], None, torch.device("cpu"), runs["data"])
    seen = []
    inner = decoding.nat_generate(loaded.task.model, decoding.nat_settings(loaded.task))

    def spy(src_tokens):
        seen.append(src_tokens.size(0))
        return inner(src_tokens)

    one = decoding.timed_decode(loaded.task.tokenizer, loaded.dataset, spy, 8000, torch.device("cpu"), 1)
    assert seen == [1] * 12 and one.batch_sizes == seen
    seen.clear()
    full = decoding.timed_decode(loaded.task.tokenizer, loaded.dataset, spy, 8000, torch.device("cpu"))
    assert seen == [12] and full.batch_sizes == [12]
    assert one.hypotheses == full.hypotheses  # batching changes speed, not the output
    assert all(1 <= n <= MAX_ITER for n in one.iterations) and one.iterations == full.iterations


def test_nat_and_teacher_rows_end_to_end(runs, tmp_path):
    out = tmp_path / "out"
    argv = ["--only", "decoding", "nat", "--runs-dir", str(runs["runs"]), "--data-dir", str(runs["data"]),
            "--limit", "10", "--batch1-limit", "4", "--beams", "5", "--device", "cpu", "--out", str(out)]
    assert bench_run.main(argv) == 0
    for name in ("nat.csv", "nat.png", "decoding.csv", "results.json"):
        assert (out / name).stat().st_size > 0
    report = json.loads((out / "results.json").read_text())

    ar = report["decoding"]["rows"]
    assert [r["model"] for r in ar] == ["transformer_small"]  # NAT checkpoints never enter the beam-search table

    info = {i["role"]: i for i in report["nat"]["info"] if i["role"] == "teacher"}
    assert info["teacher"]["ckpt"] == str(runs["teacher"])
    assert [i["ckpt"] for i in report["nat"]["info"] if i["role"] == "nat"] == [str(runs["disco"]), str(runs["cmlm"])]
    rows = report["nat"]["rows"]
    assert [(r["model"], r["role"], r["max_sentences"]) for r in rows] == [
        ("transformer_small", "teacher", 1), ("disco_small", "nat", 1), ("cmlm_small", "nat", 1),
        ("transformer_small", "teacher", None), ("disco_small", "nat", None), ("cmlm_small", "nat", None)]
    for r in rows:
        one = r["max_sentences"] == 1
        assert r["sentences"] == (4 if one else 10)
        assert r["largest_batch"] == (1 if one else 10) and r["batches"] == (4 if one else 1)
        assert math.isfinite(r["bleu"]) and r["sentences_per_s"] > 0
        teacher = next(t for t in rows if t["role"] == "teacher" and t["max_sentences"] == r["max_sentences"])
        assert r["speed_ratio"] == pytest.approx(r["sentences_per_s"] / teacher["sentences_per_s"])
        assert r["cpu_speed_ratio"] == pytest.approx(teacher["cpu_seconds"] / r["cpu_seconds"])  # same sentences
        if r["role"] == "teacher":
            assert (r["decoder"], r["beam"], r["avg_iterations"], r["length_beam"]) == ("beam", 5, None, None)
        else:
            assert r["decoder"] == ("easy_first" if r["model"] == "disco_small" else "mask_predict")
            assert (r["length_beam"], r["max_iterations"]) == (5, MAX_ITER)
            assert 1 <= r["avg_iterations"] <= MAX_ITER
            if r["decoder"] == "mask_predict":
                assert r["avg_iterations"] == MAX_ITER  # mask-predict always runs every pass
    table = decoding.format_nat_table([decoding.DecodeResult(**{k: v for k, v in r.items() if k != "batching"})
                                       for r in rows])
    assert "easy_first" in table and "mask_predict" in table and "batch 1" in table and "beam 5" in table


def test_overrides_and_role_checks(runs):
    res = decoding.run_nat_benchmark(nat_ckpt=runs["cmlm"], teacher=None, runs_dir=runs["root"] / "none",
                                     data_dir=runs["data"], limit=3, batch1_limit=2, device="cpu", length_beam=2,
                                     max_iterations=2, log=lambda *_: None)
    assert [(r.model, r.max_sentences, r.length_beam, r.max_iterations, r.avg_iterations, r.speed_ratio)
            for r in res["rows"]] == [("cmlm_small", 1, 2, 2, 2.0, None), ("cmlm_small", None, 2, 2, 2.0, None)]
    with pytest.raises(SeqmixError, match="autoregressive model .transformer_small.; pass it as --nat-teacher"):
        decoding.run_nat_benchmark(nat_ckpt=runs["teacher"], teacher=runs["teacher"], data_dir=runs["data"], limit=2,
                                   device="cpu", log=lambda *_: None)
    with pytest.raises(SeqmixError, match="non-autoregressive"):
        decoding.decode_checkpoint(runs["disco"], (1,), 2, 8000, "cpu", runs["data"], log=lambda *_: None)
