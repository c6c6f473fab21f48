"""A mixer added by config alone trains: the test tree's EMA mixer (tests/mixers/conf/mixer/ema.yaml) joins the
mixer group through hydra.searchpath, and `python train.py mixer=ema` trains a tiny model with it."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from tests.helpers import TINY, describe, run

TEST_CONF = Path(__file__).resolve().parent / "conf"


@pytest.mark.slow
def test_a_mixer_registered_by_config_trains_a_tiny_model(tmp_path):
    proc = run("train.py", [*TINY, f"hydra.searchpath=[file://{TEST_CONF}]", "mixer=ema", "trainer.max_epochs=10", "scheduler=constant", "scheduler.warmup_updates=0", "optim.lr=3e-3",
                            "run_test=false"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    ckpt = next(tmp_path.rglob("last.ckpt"))
    config = torch.load(ckpt, map_location="cpu", weights_only=False)["seqmix"]["config"]["model"]
    assert config["encoder"]["mixer"]["_target_"] == config["decoder"]["mixer"]["_target_"] \
        == "tests.mixers.ema_mixer.EMAMixer"
    with open(next(tmp_path.rglob("metrics.csv"))) as f:
        losses = [float(r["train/loss_epoch"]) for r in csv.DictReader(f) if r.get("train/loss_epoch")]
    assert len(losses) == 10 and losses[-1] < 0.9 * losses[0], losses
