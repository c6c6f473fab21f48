"""Decoding benchmarks on tiny randomly-initialized checkpoints built from the real Multi30k recipes: autoregressive
models at each beam against the Transformer, DisCo / CMLM at batch size 1 and full batches against their teacher,
through generate.py's decode path. No speed asserted."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import replace

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
TASK = "multi30k_ende"
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs/{teacher,disco,cmlm,old_disco}/checkpoints/best.ckpt (old_disco older than disco) and a 12-sentence val."""
    root = tmp_path_factory.mktemp("nat_bench")
    tok, nat, paths, now = tiny_tokenizer(), [f"task.nat.max_iterations={MAX_ITER}"], {}, time.time()
    for k, (run, exp, extra) in enumerate([("old_disco", "multi30k_disco_cpu", nat),
                                           ("teacher", "multi30k_transformer_cpu", []),
                                           ("disco", "multi30k_disco_cpu", nat), ("cmlm", "multi30k_cmlm_cpu", nat)]):
        paths[run] = save_tiny_checkpoint(root / "runs" / run / "checkpoints" / "best.ckpt", exp, tok, extra, seed=k)
        os.utime(paths[run], (now + k, now + k))
    settings = decoding.Settings(runs_dirs=(str(root / "runs"),), data_dir=str(write_val(root / "multi30k")), warmup=2)
    return {"root": root, "settings": settings, **paths}


def _fake_ckpt(path, task, model, nat=False):
    path.parent.mkdir(parents=True)
    module = "seqmix.tasks.nat_translation.NonAutoregressiveTranslationTask" if nat else "seqmix.tasks.TranslationTask"
    torch.save({"seqmix": {"config": {"task": {"name": task, "module": {"_target_": module}},
                                      "model": {"name": model, "_target_": "x"}}}}, path)


def test_discovery_newest_per_model_of_each_kind(tmp_path):
    now = time.time()
    for k, (run, task, model, nat) in enumerate([("a", TASK, "cmlm_small", True), ("b", TASK, "disco_small", True),
                                                 ("c", TASK, "disco_small", True), ("d", TASK, "lightconv_small", False),
                                                 ("e", TASK, "transformer_small", False),
                                                 ("f", "toy_reverse", "talk_small", False)]):
        path = tmp_path / ("one" if k < 2 else "two") / run / "checkpoints" / "best.ckpt"
        _fake_ckpt(path, task, model, nat)
        os.utime(path, (now + k, now + k))
    (tmp_path / "two" / "g" / "checkpoints").mkdir(parents=True)
    (tmp_path / "two" / "g" / "checkpoints" / "best.ckpt").write_bytes(b"not a checkpoint")
    s = decoding.Settings(runs_dirs=(str(tmp_path / "one"), str(tmp_path / "two")))
    found = {kind: [p.parts[-3] for p in decoding.checkpoints(s, kind).values()] for kind in (True, False)}
    assert found == {True: ["c", "a"], False: ["e", "d"]}  # DisCo first, the Transformer first; newest per model
    with pytest.raises(SeqmixError, match="non-autoregressive model .cmlm_small.: decode it in the nat section"):
        decoding.checkpoints(replace(s, ckpts=(str(tmp_path / "one" / "a" / "checkpoints" / "best.ckpt"),)), False)


def test_sections_skip_with_instructions(tmp_path):
    for nat, hint in ((False, "experiment=multi30k_transformer_cpu"), (True, "distill_dir")):
        messages = []
        assert decoding.run(decoding.Settings(runs_dirs=(str(tmp_path),)), CPU, messages.append, nat) is None
        assert hint in messages[0]


def test_batch1_decodes_one_sentence_per_batch_and_the_same_output(runs):
    ld = decoding.load(runs["disco"], runs["settings"], CPU)
    one = decoding.measure(ld, runs["settings"], CPU, 1, None)
    full = decoding.measure(ld, runs["settings"], CPU, None, None)
    assert (one["batches"], one["largest_batch"], one["batching"]) == (12, 1, "batch 1")
    assert (full["batches"], full["largest_batch"]) == (1, 12)
    assert one["bleu"] == full["bleu"] and one["avg_iterations"] == full["avg_iterations"]  # batching: speed only
    assert 1 <= one["avg_iterations"] <= MAX_ITER


def test_decoding_and_nat_end_to_end(runs, tmp_path):
    s = replace(runs["settings"], limit=10, batch1_limit=4, beams=(1, 5), forced_lengths=(6,), forced_limit=3)
    assert bench_run.main(["--only", "decoding", "nat", "--out", str(tmp_path)], {"decoding": s, "nat": s}) == 0
    report = json.loads((tmp_path / "results.json").read_text())
    ar = report["decoding"]["rows"]
    assert [(r["model"], r["beam"], r["length"], r["sentences"], r["speed_ratio"]) for r in ar] == [
        ("transformer_small", 1, None, 10, 1.0), ("transformer_small", 5, None, 10, 1.0),  # no NAT here
        ("transformer_small", 1, 6, 3, 1.0), ("transformer_small", 5, 6, 3, 1.0)]
    for r in ar[2:]:  # every best hypothesis: 6 tokens and eos
        assert round(r["tokens_per_s"] * r["seconds"]) == 3 * 7
    rows = report["nat"]["rows"]
    assert [(r["model"], r["role"], r["max_sentences"]) for r in rows] == [
        ("transformer_small", "teacher", 1), ("disco_small", "nat", 1), ("cmlm_small", "nat", 1),
        ("transformer_small", "teacher", None), ("disco_small", "nat", None), ("cmlm_small", "nat", None)]
    assert [i["ckpt"] for i in report["nat"]["info"]] == [str(runs[k]) for k in ("teacher", "disco", "cmlm")]
    for r in rows:
        one = r["max_sentences"] == 1
        assert (r["sentences"], r["batches"], r["largest_batch"]) == ((4, 4, 1) if one else (10, 1, 10))
        assert math.isfinite(r["bleu"]) and r["sentences_per_s"] > 0 and r["cpu_seconds"] > 0
        teacher = next(t for t in rows if t["role"] == "teacher" and t["max_sentences"] == r["max_sentences"])
        assert r["speed_ratio"] == pytest.approx(r["sentences_per_s"] / teacher["sentences_per_s"])
        assert r["cpu_speed_ratio"] == pytest.approx(teacher["cpu_seconds"] / r["cpu_seconds"])  # same sentences
        if r["role"] == "teacher":
            assert (r["decoder"], r["beam"], r["avg_iterations"], r["length_beam"]) == ("beam", 5, None, None)
        else:
            assert r["decoder"] == ("easy_first" if r["model"] == "disco_small" else "mask_predict")
            assert (r["length_beam"], r["max_iterations"]) == (5, MAX_ITER) and 1 <= r["avg_iterations"] <= MAX_ITER
            assert r["decoder"] == "easy_first" or r["avg_iterations"] == MAX_ITER  # mask-predict runs every pass
    for name in ("decoding.csv", "decoding.png", "nat.csv", "nat.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_overrides_and_roles(runs):
    s = replace(runs["settings"], ckpts=(str(runs["cmlm"]),), runs_dirs=(str(runs["root"] / "none"),), limit=3,
                batch1_limit=2, length_beam=2, max_iterations=2)
    rows = decoding.run(s, CPU, lambda *_: None, nat=True)["rows"]
    assert [(r["model"], r["max_sentences"], r["length_beam"], r["max_iterations"], r["avg_iterations"],
             r["speed_ratio"]) for r in rows] == [("cmlm_small", 1, 2, 2, 2.0, None), ("cmlm_small", None, 2, 2, 2.0, None)]
    with pytest.raises(SeqmixError, match="autoregressive model .transformer_small.: decode it in the decoding"):
        decoding.run(replace(s, ckpts=(str(runs["teacher"]),)), CPU, nat=True)
    with pytest.raises(SeqmixError, match="non-autoregressive"):
        decoding.run(replace(s, ckpts=(str(runs["disco"]),)), CPU)
