"""Every parameter of every model gets a gradient from one training loss: what lets ``trainer=ddp`` keep DDP's
``find_unused_parameters`` off (conf/trainer/ddp.yaml). A parameter left out would hang or stop DDP at the first
update; this finds it on the CPU instead."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate

from seqmix.config.build import build_task
from tests.helpers import run_config

CONF = Path(__file__).resolve().parents[2] / "conf"
DATA = ["task=toy_reverse", "task.data.max_tokens=256", "task.data.source.num_train=50",
        "task.data.source.num_valid=10", "task.data.source.num_test=10"]
SIZE = ["model.embed_dim=16", "model.encoder.layers=2", "model.decoder.layers=2", "model.encoder.ffn_dim=32",
        "model.decoder.ffn_dim=32", "model.encoder.heads=2", "model.decoder.heads=2"]
# the *_small configs are their model at a smaller size: same parameters, so one of each architecture
MODELS = [path.stem for path in sorted((CONF / "model").glob("*.yaml")) if not path.stem.endswith("_small")]


@pytest.mark.parametrize("model", MODELS)
def test_one_loss_reaches_every_parameter(model, tmp_path):
    size = [] if model.startswith("convs2s") else SIZE  # ConvS2S sizes its blocks in its own list
    cfg = run_config([f"model={model}", *DATA, *size, f"task.data.cache_dir={tmp_path}"])
    data = instantiate(cfg.task.data, _convert_="all")
    data.setup("fit")
    torch.manual_seed(0)
    task = build_task(cfg, data.tokenizer).train()
    task.compute_loss(next(iter(data.train_dataloader())))[0].backward()
    unused = [name for name, p in task.named_parameters() if p.requires_grad and p.grad is None]
    assert not unused, f"{model}: no gradient for {unused}"
