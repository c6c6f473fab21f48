"""End-to-end runs of train.py / generate.py in subprocesses (working directory elsewhere on purpose)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import TINY, describe, run

pytestmark = pytest.mark.slow


def checkpoints(log_dir: Path) -> list[Path]:
    return sorted(log_dir.rglob("*.ckpt"))


def test_default_train_fast_variant(tmp_path):
    proc = run("train.py", [*TINY, "trainer.max_epochs=2"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert "test BLEU:" in proc.stdout
    assert "sacreBLEU: nrefs:1|case:mixed|eff:no|tok:13a" in proc.stdout
    ckpt_line = [line for line in proc.stdout.splitlines() if line.startswith("checkpoint: ")][-1]
    assert Path(ckpt_line.split(": ", 1)[1]).is_file()
    assert any("parameters: " in line for line in proc.stdout.splitlines())


def test_dry_run_leaves_no_run_folder_but_keeps_a_folder_with_files(tmp_path):
    """dry_run=true only prints the model: Hydra's run folder (.hydra/, an empty log) and the runs/ folder it made
    go; a run folder given with hydra.run.dir that already holds something stays."""
    logs = tmp_path / "logs"
    proc = run("train.py", ["dry_run=true"], logs)
    assert proc.returncode == 0 and "parameters: " in proc.stdout, describe(proc)
    assert list(logs.iterdir()) == [], sorted(logs.rglob("*"))
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine\n")
    proc = run("train.py", ["dry_run=true", f"hydra.run.dir={kept}"], logs)
    assert proc.returncode == 0, describe(proc)
    assert (kept / "notes.txt").read_text() == "mine\n" and (kept / ".hydra" / "config.yaml").is_file()


def test_resume_continues_steps_lr_and_optimizer(tmp_path):
    first = run("train.py", [*TINY, "trainer.max_steps=6", "trainer.max_epochs=-1", "run_test=false",
                             "trainer.limit_val_batches=1", "scheduler.warmup_updates=100"], tmp_path / "a")
    assert first.returncode == 0, describe(first)
    last = next(p for p in checkpoints(tmp_path / "a") if p.name == "last.ckpt")
    before = torch.load(last, weights_only=False)
    assert before["global_step"] == 6
    second = run("train.py", [*TINY, "trainer.max_steps=10", "trainer.max_epochs=-1", "run_test=false",
                              "trainer.limit_val_batches=1", "scheduler.warmup_updates=100",
                              f"ckpt_path={last}"], tmp_path / "b")
    assert second.returncode == 0, describe(second)
    after = torch.load(next(p for p in checkpoints(tmp_path / "b") if p.name == "last.ckpt"), weights_only=False)
    assert after["global_step"] == 10
    adam_steps = {float(s["step"]) for s in after["optimizer_states"][0]["state"].values()}
    assert adam_steps == {10.0}, "optimizer state was not restored (Adam step counts restarted)"
    sched = after["lr_schedulers"][0]
    assert sched["last_epoch"] == 10
    peak = 1e-3
    expected = 1e-7 / peak + (1 - 1e-7 / peak) * 10 / 100
    assert after["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(peak * expected, rel=1e-6)


def test_init_from_starts_a_new_run_from_the_weights_only(tmp_path):
    first = run("train.py", [*TINY, "trainer.max_steps=6", "trainer.max_epochs=-1", "run_test=false",
                             "trainer.limit_val_batches=1"], tmp_path / "a")
    assert first.returncode == 0, describe(first)
    last = next(p for p in checkpoints(tmp_path / "a") if p.name == "last.ckpt")
    source = torch.load(last, weights_only=False)["state_dict"]
    # a learning rate of ~0: the new run's weights stay those of the checkpoint, while its counters restart
    second = run("train.py", [*TINY, "trainer.max_steps=2", "trainer.max_epochs=-1", "run_test=false",
                              "trainer.limit_val_batches=1", "scheduler=constant", "optim.lr=1e-12",
                              f"init_from={last}"], tmp_path / "b")
    assert second.returncode == 0, describe(second)
    after = torch.load(next(p for p in checkpoints(tmp_path / "b") if p.name == "last.ckpt"), weights_only=False)
    assert after["global_step"] == 2
    assert {float(s["step"]) for s in after["optimizer_states"][0]["state"].values()} == {2.0}
    assert after["state_dict"].keys() == source.keys()
    for name, weight in source.items():
        torch.testing.assert_close(after["state_dict"][name], weight, rtol=0, atol=1e-9)
    logs = tmp_path / "c"
    logs.mkdir()
    wrong = run("train.py", [*TINY, "model.embed_dim=48", f"init_from={last}"], logs)
    assert_clean_failure(wrong, logs, "seqmix: error:", "does not fit this model", "shape")
    both = run("train.py", [*TINY, f"init_from={last}", f"ckpt_path={last}"], logs)
    assert_clean_failure(both, logs, "seqmix: error:", "pass one of them")


def test_two_process_cpu_ddp(tmp_path):
    proc = run("train.py", [*TINY, "trainer.accelerator=cpu", "trainer.devices=2", "trainer.strategy=ddp",
                            "trainer.max_epochs=1", "trainer.limit_val_batches=1"], tmp_path, timeout=900)
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout.count("test BLEU:") == 1  # printed by rank 0 only
    assert checkpoints(tmp_path)


def test_multirun_two_jobs_two_dirs_two_wandb_runs(tmp_path):
    proc = run("train.py", ["-m", "seed=1,2", *[a for a in TINY if a != "logger=csv"], "logger=wandb",
                            "trainer.max_epochs=1", "run_test=false", "trainer.limit_val_batches=1"],
               tmp_path, timeout=900, env={"WANDB_MODE": "", "WANDB_API_KEY": ""})
    assert proc.returncode == 0, describe(proc)
    sweep = next((tmp_path / "multiruns").iterdir())
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in jobs] == ["0", "1"]
    for job in jobs:
        assert list(job.rglob("*.ckpt")), f"no checkpoint in {job}"
        runs = list((job / "wandb").glob("offline-run-*"))
        assert len(runs) == 1, f"expected one offline wandb run in {job}, found {runs}"


def test_generate_scores_a_split_and_averages(tmp_path):
    train = run("train.py", [*TINY, "trainer.max_epochs=3", "run_test=false", "keep_last_epochs=2"], tmp_path / "t")
    assert train.returncode == 0, describe(train)
    best = next(p for p in checkpoints(tmp_path / "t") if p.name == "best.ckpt")
    gen = run("generate.py", [f"ckpt_path={best}", "split=test", "beam_size=2"], tmp_path / "g")
    assert gen.returncode == 0, describe(gen)
    assert "sacreBLEU: nrefs:1" in gen.stdout
    hyp_file = Path(next(line for line in gen.stdout.splitlines() if line.startswith("hypotheses: ")).split(": ")[1])
    assert len(hyp_file.read_text().splitlines()) == 40
    avg = run("generate.py", [f"ckpt_path={best}", "split=test", "average_last=2"], tmp_path / "g2")
    assert avg.returncode == 0, describe(avg)
    assert "BLEU: " in avg.stdout


def assert_clean_failure(proc, log_dir: Path, *needles: str):
    assert proc.returncode != 0, describe(proc)
    assert "Traceback" not in proc.stderr, describe(proc)
    for needle in needles:
        assert needle in proc.stderr + proc.stdout, describe(proc)
    assert not checkpoints(log_dir)
    runs = log_dir / "runs"
    assert not runs.exists() or not any(runs.iterdir()), f"left behind: {list(runs.iterdir())}"
