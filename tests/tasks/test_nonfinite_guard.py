"""A non-finite loss ends training with one clear error naming the update it happened at, and no checkpoint is
written after it, also when the flag is read back only every few updates (as on CUDA, to keep the GPU busy)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import open_dict

from seqmix.cli.resolvers import register_resolvers
from seqmix.errors import SeqmixError
from seqmix.tasks.factory import build_task

register_resolvers()
CONF = Path(__file__).resolve().parents[2] / "conf"
TINY = ["task.data.source.num_train=200", "task.data.source.num_valid=20", "task.data.source.num_test=20",
        "model.embed_dim=16", "model.encoder.layers=1", "model.decoder.layers=1", "model.encoder.ffn_dim=32",
        "model.decoder.ffn_dim=32", "model.encoder.heads=2", "model.decoder.heads=2", "task.data.max_tokens=256"]


def tiny_run(tmp_path, interval, nan_at):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[*TINY, f"task.data.cache_dir={tmp_path / 'cache'}"],
                      return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # ${hydra:...} in the run config resolves outside a run
    with open_dict(cfg):
        del cfg["hydra"]
    datamodule = instantiate(cfg.task.data, _convert_="all")
    datamodule.setup("fit")
    task = build_task(cfg, datamodule.tokenizer)
    task.finite_check_interval = interval
    clean = task.compute_loss

    def poisoned(batch):
        loss, nll, ntokens = clean(batch)
        return (loss * float("nan"), nll, ntokens) if task.global_step == nan_at else (loss, nll, ntokens)

    task.compute_loss = poisoned
    ckpts = tmp_path / "ckpts"
    trainer = L.Trainer(max_steps=12, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=str(tmp_path),
                        callbacks=[ModelCheckpoint(dirpath=ckpts, every_n_train_steps=4, save_top_k=-1)])
    with pytest.raises(SeqmixError, match=f"non-finite at step {nan_at}") as info:
        trainer.fit(task, datamodule=datamodule)
    return info, trainer, sorted(p.name for p in ckpts.glob("*.ckpt"))


def test_caught_at_the_update_itself_on_cpu(tmp_path):
    _, trainer, ckpts = tiny_run(tmp_path, interval=None, nan_at=5)
    assert trainer.global_step == 5 and ckpts == ["epoch=0-step=4.ckpt"]


def test_a_deferred_check_still_stops_before_the_next_checkpoint(tmp_path):
    """Read back every 100 updates: the NaN of update 5 is not seen at once, but the checkpoint due at update 8 is
    refused (its weights come from NaN gradients) and the error names update 5."""
    _, trainer, ckpts = tiny_run(tmp_path, interval=100, nan_at=5)
    assert trainer.global_step == 8 and ckpts == ["epoch=0-step=4.ckpt"]
    assert not any(torch.isfinite(p).all() for p in trainer.lightning_module.parameters() if p.dim() > 1)
