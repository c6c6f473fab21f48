"""Training throughput: the real Multi30k recipes fitted by Lightning on their own first batches (tiny budgets), a row
per model with ratios against the Transformer of the same run, a model that does not train refused. No speed asserted."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import run as bench_run
from benchmarks import training
from seqmix.config.build import build_model
from seqmix.models import count_parameters
from tests.benchmark_fixtures import one_thread  # noqa: F401  (autouse fixture)

SMALL = training.Settings(models=("convs2s_small", "nope_small"), warmup=0, repeats=2, max_tokens=128)
CPU = torch.device("cpu")


def test_recipes_compose_as_train_py_would():
    assert training.RECIPES[0] == training.BASELINE == "transformer_small"
    disco = training.compose_recipe("disco_small")
    assert disco.model.name == "disco_small" and disco.optim._target_ == "torch.optim.AdamW"
    assert disco.task.module._target_.endswith("NonAutoregressiveTranslationTask")
    convs2s = training.compose_recipe("convs2s_small", ["task.data.max_tokens=64"])
    assert convs2s.model.dropout == 0.2 and convs2s.task.data.max_tokens == 64  # the recipe's, then the override
    with pytest.raises(ValueError, match="multi30k_nope_cpu"):
        training.compose_recipe("nope_small")


def test_the_task_setting_times_another_task_s_recipes():
    """``Settings.task`` picks ``conf/experiment/<task>_<name>_cpu.yaml``: DialogSum's Transformer, not Multi30k's."""
    dialogsum = training.compose_recipe("transformer_small", ["model.encoder.mixer.attention_dropout=0.1"], "dialogsum")
    assert dialogsum.task.name == "dialogsum" and dialogsum.task.data.truncate_source == 400
    assert dialogsum.model.encoder.normalize_before and dialogsum.model.encoder.mixer.attention_dropout == 0.1
    row = training.measure_row("nope_small", training.Settings(task="dialogsum"), [], CPU)
    assert row["experiment"] == "dialogsum_nope_cpu" and row["status"].startswith("ERROR: ")
    assert "dialogsum_nope_cpu" in row["status"] and row["ms_per_update"] is None


def test_rows_per_recipe_with_ratios_against_the_transformer(multi30k_dir, tmp_path):
    assert bench_run.main(["--only", "training", "--out", str(tmp_path)], {"training": SMALL}) == 1  # nope_small
    report = json.loads((tmp_path / "results.json").read_text())["training"]
    rows = report["rows"]
    assert [(r["model"], r["status"][:5]) for r in rows] == [
        ("transformer_small", "ok"), ("convs2s_small", "ok"), ("nope_small", "ERROR")]  # the baseline added first
    base, convs2s, nope = rows
    assert report["info"]["same_batches"] and base["batch_digest"] == convs2s["batch_digest"]
    for r in (base, convs2s):
        assert r["max_tokens"] == 128 and r["updates"] == 2 and r["accumulate"] == 1
        for key in ("ms_per_update", "tokens_per_s", "tgt_tokens_per_update", "final_loss", "cpu_ms_per_update"):
            assert r[key] is not None and math.isfinite(r[key]) and r[key] > 0, key
        assert r["ms_min"] <= r["ms_per_update"] <= r["ms_max"]
        assert r["speed_ratio"] == pytest.approx(r["tokens_per_s"] / base["tokens_per_s"])
        assert r["time_ratio"] == pytest.approx(r["ms_per_update"] / base["ms_per_update"])
        assert r["cpu_time_ratio"] == pytest.approx(r["cpu_ms_per_update"] / base["cpu_ms_per_update"])
        assert r["gflops_per_s"] == pytest.approx(r["flops_per_tgt_token"] * r["tokens_per_s"] / 1e9)
        assert r["matmul_fraction"] == pytest.approx(r["gflops_per_s"] / r["matmul_gflops_per_s"])
        cfg = training.compose_recipe(r["model"])
        with torch.device("meta"):
            assert r["parameters"] == count_parameters(build_model(cfg, 8000, 1))  # the recipe's size
    assert nope["tokens_per_s"] is None and nope["speed_ratio"] is None and "multi30k_nope_cpu" in nope["status"]
    assert nope["matmul_fraction"] is None
    vocab_dim = 8000 * training.compose_recipe("transformer_small").model.embed_dim
    assert base["flops_per_tgt_token"] > 6 * vocab_dim  # the output projection's forward and backward alone
    for name in ("training.csv", "training.png"):
        assert (tmp_path / name).stat().st_size > 0


def test_updates_group_the_accumulated_batches(multi30k_dir):
    s = training.Settings(warmup=0, repeats=2)
    row = training.measure("transformer_small", s, ["task.data.max_tokens=128", "trainer.accumulate_grad_batches=2"], CPU)
    one = training.measure("transformer_small", s, ["task.data.max_tokens=128"], CPU)
    assert row["accumulate"] == 2 and row["updates"] == 2 and one["updates"] == 2
    assert row["tgt_tokens_per_update"] > 1.5 * one["tgt_tokens_per_update"]  # two batches per update


def nan_loss_for(monkeypatch, model_cls: type = torch.nn.Module) -> None:
    """Every translation loss of a ``model_cls`` model turns NaN (the others are left as they are)."""
    from seqmix.tasks.translation import TranslationTask

    original = TranslationTask.compute_loss

    def nan_loss(self, batch):
        loss, nll, ntokens = original(self, batch)
        return (loss * float("nan") if isinstance(self.model, model_cls) else loss), nll, ntokens

    monkeypatch.setattr(TranslationTask, "compute_loss", nan_loss)


def test_a_model_that_does_not_train_is_refused(multi30k_dir, monkeypatch):
    from seqmix.models.convs2s import ConvS2S

    nan_loss_for(monkeypatch, ConvS2S)
    rows = training.run(training.Settings(models=("convs2s_small",), warmup=0, repeats=1, max_tokens=128), CPU,
                        log=lambda *_: None)
    assert rows[0]["status"] == "ok" and rows[0]["speed_ratio"] == 1.0
    assert rows[1]["status"].startswith("FAILED: training loss became non-finite")  # the task's own guard refused it
    assert rows[1]["ms_per_update"] is None and rows[1]["speed_ratio"] is None


def test_a_non_finite_loss_fails_the_row_where_the_guard_reads_it_late(multi30k_dir, monkeypatch):
    """On a GPU the task's guard reads the loss every 50 updates, more than a row makes: the row still fails."""
    from seqmix.tasks.base import SeqmixTask

    nan_loss_for(monkeypatch)
    monkeypatch.setattr(SeqmixTask, "finite_check_interval", 50)  # the accelerator's spacing, on the CPU
    row = training.measure_row("transformer_small", training.Settings(warmup=0, repeats=2), ["task.data.max_tokens=128"],
                               CPU)
    assert row["status"].startswith("FAILED: training loss became non-finite at step 0")
    assert row["ms_per_update"] is None


class _AttentionTask(torch.nn.Module):
    """A stand-in task: one linear layer, then CPU attention over its output (counted by a custom mapping)."""

    compile_training = True

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 16, bias=False)

    def compute_loss(self, batch):
        h = self.proj(batch["x"]).view(2, 2, 5, 8)  # (B, H, T, head dim)
        out = torch.nn.functional.scaled_dot_product_attention(h, h, h)
        return out.square().sum(), None, int(batch["ntokens"])


def test_update_flops_count_matmuls_forward_and_backward_and_cpu_attention():
    class Data:
        def train_dataloader(self):
            return [{"x": torch.randn(10, 8), "ntokens": torch.tensor(4)}]

    task = _AttentionTask()
    task.compile_training = True
    per_token = training.update_flops_per_target_token(task, Data(), CPU)
    linear = 2 * (2 * 10 * 8 * 16)  # forward and weight gradient (the input needs none)
    attention = (2 + 5) * (2 * (2 * 2) * 5 * 5 * 8)  # 2 (B*H, T, T|D) products forward, 5 backward; 2*B*H*T*T*D each
    assert per_token * 4 == linear + attention
    assert task.compile_training is True and task.proj.weight.grad is None  # counted eagerly, nothing left behind
