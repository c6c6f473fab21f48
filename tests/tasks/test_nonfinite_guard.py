"""A non-finite loss ends training with one clear error naming the update it happened at, and no checkpoint is
written after it, also when the flag is read back only every few updates (as on CUDA, to keep the GPU busy).
With ``nonfinite=skip`` the update is dropped instead (weights and optimizer state unchanged) and counted, until
too many come in a row."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint

from seqmix.config.build import build_task
from seqmix.config.resolvers import register_resolvers
from seqmix.errors import SeqmixError
from tests.helpers import run_config

register_resolvers()
CONF = Path(__file__).resolve().parents[2] / "conf"
TINY = ["task.data.source.num_train=200", "task.data.source.num_valid=20", "task.data.source.num_test=20",
        "model.embed_dim=16", "model.encoder.layers=1", "model.decoder.layers=1", "model.encoder.ffn_dim=32",
        "model.decoder.ffn_dim=32", "model.encoder.heads=2", "model.decoder.heads=2", "task.data.max_tokens=256"]


def tiny_run(tmp_path, interval, nan_at, checkpoint_every=4):
    cfg = run_config([*TINY, f"task.data.cache_dir={tmp_path / 'cache'}"])
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
                        callbacks=[ModelCheckpoint(dirpath=ckpts, every_n_train_steps=checkpoint_every, save_top_k=-1)])
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


def test_a_deferred_check_is_read_once_more_when_training_ends(tmp_path):
    """A NaN after the last read-back and with no checkpoint to come still fails the fit (a short run on a GPU)."""
    _, trainer, ckpts = tiny_run(tmp_path, interval=100, nan_at=10, checkpoint_every=100)
    assert trainer.global_step == 12 and ckpts == []


def skip_run(tmp_path, poison, limit=10, steps=12, policy="skip", callbacks=(), plugins=()):
    """The tiny task under ``nonfinite=skip``, ``poison(task, loss) -> loss`` applied to every update's loss; returns
    the trainer, the task and the weights before and after each update."""
    cfg = run_config([*TINY, f"task.data.cache_dir={tmp_path / 'cache'}", f"nonfinite={policy}",
                      f"nonfinite_skip_limit={limit}"])
    datamodule = instantiate(cfg.task.data, _convert_="all")
    datamodule.setup("fit")
    task = build_task(cfg, datamodule.tokenizer)
    clean = task.compute_loss

    def poisoned(batch):
        loss, nll, ntokens = clean(batch)
        return poison(task, loss), nll, ntokens

    task.compute_loss = poisoned
    weights = []

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, module, *args):
            weights.append([p.detach().clone() for p in module.parameters()])

    trainer = L.Trainer(max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=str(tmp_path),
                        enable_checkpointing=bool(callbacks), callbacks=[Record(), *callbacks], plugins=list(plugins))
    return trainer, task, datamodule, weights


def nan_loss_at(step):
    return lambda task, loss: loss * float("nan") if task.global_step == step else loss


def nan_gradient_at(step):
    """A finite loss whose gradient is NaN: d sqrt(u)/du is infinite at u = 0, times du/dw = 0."""
    def poison(task, loss):
        w = next(task.parameters()).flatten()[0]
        return loss + torch.sqrt(w * 0.0) if task.global_step == step else loss
    return poison


@pytest.mark.parametrize("poison", [nan_loss_at(5), nan_gradient_at(5)], ids=["loss", "gradient"])
def test_skip_drops_the_update_and_training_goes_on(tmp_path, poison):
    trainer, task, datamodule, weights = skip_run(tmp_path, poison)
    trainer.fit(task, datamodule=datamodule)
    assert trainer.global_step == 12 and task.skipped_updates == 1
    assert all(torch.equal(a, b) for a, b in zip(weights[5], weights[6]))  # update 5 changed nothing
    assert not all(torch.equal(a, b) for a, b in zip(weights[6], weights[7]))  # update 6 trained again
    assert all(torch.isfinite(p).all() for p in task.parameters())
    adam_steps = {float(s["step"]) for s in trainer.optimizers[0].state.values()}
    assert adam_steps == {11.0}  # the optimizer state saw 11 of the 12 updates
    assert trainer.callback_metrics["train/skipped_updates"] == 1.0


def test_skip_stops_after_the_limit_in_a_row_with_finite_weights(tmp_path):
    poison = lambda task, loss: loss * float("nan") if task.global_step >= 3 else loss  # noqa: E731
    trainer, task, datamodule, weights = skip_run(tmp_path, poison, limit=4)
    with pytest.raises(SeqmixError, match="4 updates in a row"):
        trainer.fit(task, datamodule=datamodule)
    assert task.skipped_updates == 4
    assert all(torch.isfinite(p).all() for p in task.parameters())


def fp16_with_loss_scaler(init_scale: float):
    """16-mixed as on CUDA, on the CPU: fp16 autocast and a gradient scaler (Lightning gives the CPU none)."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    return MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=init_scale))


def test_loss_scaler_finding_its_scale_is_not_a_non_finite_skip(tmp_path):
    """A scale far too high overflows every step until it has halved enough: many skips in a row with a finite
    loss, which must not stop the run (4 in a row would) nor count as non-finite updates."""
    trainer, task, datamodule, weights = skip_run(tmp_path, lambda task, loss: loss, limit=4,
                                                  plugins=[fp16_with_loss_scaler(2.0**40)])
    trainer.fit(task, datamodule=datamodule)
    assert trainer.global_step == 12 and task.skipped_updates == 0
    assert task.loss_scale_skips >= 5 and trainer.callback_metrics["train/loss_scale_skips"] == task.loss_scale_skips
    assert all(torch.equal(a, b) for a, b in zip(weights[0], weights[1]))  # the first step overflowed: no change


def test_under_the_loss_scaler_a_non_finite_loss_still_counts(tmp_path):
    trainer, task, datamodule, weights = skip_run(tmp_path, nan_loss_at(5), plugins=[fp16_with_loss_scaler(2.0**8)])
    trainer.fit(task, datamodule=datamodule)
    assert task.skipped_updates == 1 and task.loss_scale_skips == 0
    assert all(torch.equal(a, b) for a, b in zip(weights[5], weights[6]))


def test_unknown_policy_is_a_user_error(tmp_path):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["nonfinite=ignore"])
    from seqmix.config.build import nonfinite_policy

    with pytest.raises(SeqmixError, match=r"nonfinite='ignore': must be one of \['raise', 'skip'\]"):
        nonfinite_policy(cfg)


def test_a_non_finite_gradient_under_raise_never_reaches_a_checkpoint(tmp_path):
    """The loss of update 5 stays finite, so the per-update guard cannot see its NaN gradient; the checkpoint due
    right after it (step 6) is refused because the weights are not finite."""
    ckpts = tmp_path / "ckpts"
    trainer, task, datamodule, _ = skip_run(tmp_path, nan_gradient_at(5), policy="raise",
                                            callbacks=[ModelCheckpoint(dirpath=ckpts, every_n_train_steps=3,
                                                                       save_top_k=-1)])
    with pytest.raises(SeqmixError, match="weights are not finite at step 6"):
        trainer.fit(task, datamodule=datamodule)
    assert sorted(p.name for p in ckpts.glob("*.ckpt")) == ["epoch=0-step=3.ckpt"]
