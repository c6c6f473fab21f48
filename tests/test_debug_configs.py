"""``debug=fdr|overfit|limit|profiler``: each composes on top of any run, writes to <log_dir>/debug, and does what
its name says (counted in the run's record and files, not just "it ran")."""

from __future__ import annotations

import csv
import json

import pytest

from tests.helpers import TINY, run


def describe(proc) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def debug_run(tmp_path, name: str, *more: str):
    proc = run("train.py", [f"debug={name}", *TINY, *more], tmp_path, timeout=900)
    assert proc.returncode == 0, describe(proc)
    (folder,) = (tmp_path / "debug" / "runs").iterdir()
    return folder, json.loads((folder / "run.json").read_text())


def test_fdr_runs_one_batch_and_saves_nothing(tmp_path):
    folder, record = debug_run(tmp_path, "fdr")
    assert record["status"] == "finished" and record["updates"] == 1
    assert not list(folder.rglob("*.ckpt"))


def test_overfit_drives_the_loss_on_three_batches_down(tmp_path):
    folder, record = debug_run(tmp_path, "overfit", "trainer.check_val_every_n_epoch=10")  # 5 validations, not 50
    assert record["updates"] == 3 * 50
    (metrics,) = folder.rglob("metrics.csv")
    losses = [float(r["train/loss_epoch"]) for r in csv.DictReader(metrics.open()) if r.get("train/loss_epoch")]
    assert len(losses) == 50 and losses[-1] < 0.75 * losses[0]


def test_limit_runs_the_whole_pipeline_on_a_few_batches(tmp_path):
    folder, record = debug_run(tmp_path, "limit", "task.data.max_tokens=256")  # ~30 batches an epoch, 5 used
    assert record["updates"] == 3 * 5
    assert record["score"] is not None and (folder / "checkpoints" / "best.ckpt").is_file()


def test_profiler_writes_the_time_per_hook(tmp_path):
    folder, record = debug_run(tmp_path, "profiler")
    (profile,) = folder.glob("*profile*.txt")
    assert "run_training_epoch" in profile.read_text() and record["epochs"] >= 0


@pytest.mark.parametrize("name", ["fdr", "overfit", "limit", "profiler"])
def test_debug_configs_compose_over_an_experiment(name):
    from hydra import compose, initialize_config_dir

    from seqmix.config.resolvers import register_resolvers
    from tests.helpers import ROOT

    register_resolvers()

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["experiment=multi30k_lightconv_cpu", f"debug={name}"],
                      return_hydra_config=True)
    assert cfg.trainer.max_time is None and cfg.trainer.val_check_interval is None  # the recipe's are lifted
    assert "debug" in cfg.hydra.run.dir and list(cfg.logger) == ["csv"]
