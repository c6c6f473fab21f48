"""Training-throughput benchmark: the real Multi30k recipes, tiny batches (synthetic unless stated), no speed
asserted; rows per model, ratios against the Transformer of the same run, refusal of a model that does not train."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import run as bench_run
from benchmarks import training
from seqmix.cli.common import build_task, task_class
from seqmix.models import count_parameters
from tests.benchmark_fixtures import one_thread  # noqa: F401  (autouse fixture)

SMALL = dict(warmup=0, repeats=2, max_tokens=64, device="cpu", synthetic=True, log=lambda *_: None)


def test_recipes_compose_as_train_py_would():
    assert training.RECIPES[0] == training.BASELINE == "transformer_small"
    disco = training.compose_recipe("disco_small")
    assert disco.model.name == "disco_small" and disco.optim._target_ == "torch.optim.AdamW"
    assert disco.task.module._target_.endswith("NonAutoregressiveTranslationTask")
    convs2s = training.compose_recipe("convs2s_small", ["task.data.max_tokens=64"])
    assert convs2s.model.dropout == 0.2 and convs2s.task.data.max_tokens == 64  # the recipe's, then the override
    with pytest.raises(ValueError, match="multi30k_transformer_cpu"):
        training.compose_recipe("nope_small")


def test_rows_per_model_with_ratios_against_the_transformer():
    res = training.run_training_benchmark(["convs2s_small", "lightconv_small"], **SMALL)
    rows = res["rows"]
    assert [r.model for r in rows] == ["transformer_small", "convs2s_small", "lightconv_small"]  # baseline added
    base = rows[0]
    assert res["info"]["same_batches"] and len({r.batch_digest for r in rows}) == 1
    for r in rows:
        assert r.ok, r.status
        assert r.data == training.SYNTHETIC and r.max_tokens == 64 and r.updates == 2
        for v in (r.ms_per_update, r.tokens_per_s, r.tgt_tokens_per_update, r.final_loss):
            assert v is not None and math.isfinite(v) and v > 0
        assert r.ms_min <= r.ms_per_update <= r.ms_max
        assert r.speed_ratio == pytest.approx(r.tokens_per_s / base.tokens_per_s)
        assert r.time_ratio == pytest.approx(r.ms_per_update / base.ms_per_update)
        assert r.cpu_time_ratio == pytest.approx(r.cpu_ms_per_update / base.cpu_ms_per_update)
        cfg = training.compose_recipe(r.model)
        with torch.device("meta"):
            assert r.parameters == count_parameters(task_class(cfg).build_model(cfg, 8000, 1))  # the recipe's size
    assert base.speed_ratio == 1.0 and base.time_ratio == 1.0
    table = training.format_table(rows).splitlines()
    assert len(table) == 2 + 3 and all(m in t for m, t in zip(["transformer_small", "convs2s_small"], table[2:]))


def test_an_update_is_forward_backward_and_optimizer_step():
    cfg = training.compose_recipe("transformer_small")
    tok = training._StubTokenizer(8000)
    task = build_task(cfg, tok).train()
    from hydra.utils import instantiate

    optimizer = instantiate(cfg.optim)(params=task.parameters())
    before = {n: p.detach().clone() for n, p in task.named_parameters()}
    batch = training.synthetic_batches(1, 64, 8000)[0]
    loss = training.make_update(task, optimizer, cfg, torch.device("cpu"))([batch])
    assert math.isfinite(loss) and loss > 0
    changed = [n for n, p in task.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) > 0.9 * len(before)  # the optimizer stepped (not only forward + backward)
    assert all(p.grad is None for p in task.parameters())  # and the gradients were cleared for the next update


def test_synthetic_batches_fit_the_budget_with_multi30k_like_lengths():
    batches = training.synthetic_batches(6, 512, 8000, seed=3)
    assert len(batches) == 6
    src_lengths = []
    for b in batches:
        assert b["src_tokens"].numel() <= 512 and b["target"].numel() <= 512
        assert int(b["src_tokens"].min()) >= 1 and int(b["target"].max()) < 8000
        src_lengths += b["src_lengths"].tolist()
    mean = sum(src_lengths) / len(src_lengths)
    assert 8 < mean < 30  # Multi30k sentences, not LM blocks


def test_a_model_that_does_not_train_is_refused(monkeypatch):
    from seqmix.models.convs2s import ConvS2S
    from seqmix.tasks.translation import TranslationTask

    original = TranslationTask.compute_loss

    def nan_for_convs2s(self, batch):
        loss, nll, ntokens = original(self, batch)
        return (loss * float("nan") if isinstance(self.model, ConvS2S) else loss), nll, ntokens

    monkeypatch.setattr(TranslationTask, "compute_loss", nan_for_convs2s)
    rows = training.run_training_benchmark(["convs2s_small"], **SMALL)["rows"]
    assert rows[0].ok and rows[0].speed_ratio == 1.0
    bad = rows[1]
    assert bad.status.startswith("FAILED: training loss nan")
    assert bad.ms_per_update is None and bad.tokens_per_s is None and bad.speed_ratio is None
    assert "FAILED" in training.format_table(rows)


def test_run_writes_training_files_and_fails_on_a_broken_recipe(tmp_path):
    out = tmp_path / "out"
    argv = ["--only", "training", "--synthetic", "--train-models", "transformer_small", "nope_small",
            "--train-max-tokens", "64", "--train-repeats", "1", "--train-warmup", "0", "--device", "cpu",
            "--out", str(out)]
    assert bench_run.main(argv) == 1
    for name in ("training.csv", "training.png", "results.json"):
        assert (out / name).stat().st_size > 0
    rows = json.loads((out / "results.json").read_text())["training"]["rows"]
    assert [(r["model"], r["status"][:5]) for r in rows] == [("transformer_small", "ok"), ("nope_small", "ERROR")]
    assert rows[0]["speed_ratio"] == 1.0 and rows[1]["tokens_per_s"] is None


def test_real_multi30k_batches(multi30k_dir):
    cfg = training.compose_recipe("transformer_small", ["task.data.max_tokens=256",
                                                        f"paths.data_dir={multi30k_dir.parent}"])
    batches, tokenizer = training.real_batches(cfg, 3)
    assert tokenizer.vocab_size == 8000 and len(batches) == 3
    for b in batches:
        assert b["src_tokens"].numel() <= 256 and b["target"].numel() <= 256 and b["ntokens"] > 0
    again, _ = training.real_batches(cfg, 3)
    assert training.batch_digest(again) == training.batch_digest(batches)  # the same batches for every model
