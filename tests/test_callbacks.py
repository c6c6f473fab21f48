"""last.ckpt follows training epoch by epoch, not only when the best score improves; epoch checkpoints every epoch;
interval checkpoints (update<N>.ckpt) every N updates, the newest kept."""

from __future__ import annotations

from pathlib import Path
from unittest.mock import patch

import lightning as L
import pytest
import torch

from seqmix.errors import SeqmixError
from seqmix.training.checkpoints import IntervalCheckpoints, LastCheckpoint

BATCHES = 2


class Dies(L.LightningModule):
    """A model whose validation loss follows ``scores`` and whose training fails in the epoch after them."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.scores = scores
        self.w = torch.nn.Parameter(torch.ones(2))

    def training_step(self, batch, batch_idx):
        if self.current_epoch == len(self.scores):
            raise RuntimeError("killed")
        return (self.w * batch).sum() ** 2

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.scores[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(BATCHES, 2), batch_size=1)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(1, 2), batch_size=1)


@pytest.mark.parametrize("scores", [[1.0, 0.5, 0.7],  # the last epoch is worse than the best: still saved
                                    [1.0, 0.7, 0.5]])  # the last epoch is the best: its state says so
def test_last_checkpoint_is_the_latest_epoch_with_its_validation_seen(tmp_path, scores):
    best = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="best", monitor="val/loss")
    trainer = L.Trainer(max_epochs=10, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[best, LastCheckpoint()])
    with pytest.raises(RuntimeError, match="killed"):
        trainer.fit(Dies(scores))
    last = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert last["global_step"] == len(scores) * BATCHES
    state = next(v for k, v in last["callbacks"].items() if k.startswith("ModelCheckpoint"))
    assert state["best_model_score"].item() == pytest.approx(0.5)
    assert (tmp_path / "interrupted.ckpt").is_file()


class Trains(Dies):
    def __init__(self) -> None:
        super().__init__([1.0] * 10)


def test_epoch_checkpoints_are_written_every_epoch_not_only_when_validating(tmp_path):
    """conf/callbacks' epoch checkpoints (for average_last) with validation every 3rd epoch: one file per epoch."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    conf = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "callbacks" / "default.yaml")
    epochs = OmegaConf.merge(conf.epoch_checkpoints, {"dirpath": str(tmp_path), "save_top_k": 3})
    trainer = L.Trainer(max_epochs=5, check_val_every_n_epoch=3, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[instantiate(epochs)])
    trainer.fit(Trains())
    assert sorted(p.name for p in tmp_path.glob("epoch*.ckpt")) == [
        f"epoch{e:03d}-step{(e + 1) * BATCHES}.ckpt" for e in (2, 3, 4)]  # the latest 3 of 5 epochs, 1 validated


class Probe(L.Callback):
    """The weights after each optimizer update, as the update's ``on_train_batch_end`` sees them."""

    def __init__(self) -> None:
        self.weights: dict[int, torch.Tensor] = {}

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.weights.setdefault(trainer.global_step, pl_module.w.detach().clone())


def interval_trainer(tmp_path: Path, interval: IntervalCheckpoints, **options) -> tuple[L.Trainer, Probe]:
    probe = Probe()
    best = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="best", monitor="val/loss")
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, max_epochs=-1,
                        callbacks=[probe, best, LastCheckpoint(), interval], **options)
    return trainer, probe


def test_interval_checkpoints_keep_the_newest_updates_with_the_weights_of_that_update(tmp_path):
    """Every 2 updates of 9, two batches accumulated per update, the newest 3 kept: updates 4, 6 and 8, each with
    the weights and step count of its update (written once per update, not once per batch), as complete as
    last.ckpt; files not named as it names them stay."""
    (tmp_path / "update-notes.ckpt").write_text("not ours")
    (tmp_path / "epoch000-step2.ckpt").write_text("not ours")
    trainer, probe = interval_trainer(tmp_path, IntervalCheckpoints(every_n_updates=2, keep=3), max_steps=9,
                                      accumulate_grad_batches=2)
    with patch.object(trainer, "save_checkpoint", wraps=trainer.save_checkpoint) as save:
        trainer.fit(Trains())
    written = [Path(c.args[0]).name for c in save.call_args_list if Path(c.args[0]).name.startswith("update")]
    assert written == [f"update{u:07d}.ckpt" for u in (2, 4, 6, 8)]
    assert sorted(p.name for p in tmp_path.glob("update*")) == [
        "update-notes.ckpt", "update0000004.ckpt", "update0000006.ckpt", "update0000008.ckpt"]
    assert (tmp_path / "epoch000-step2.ckpt").read_text() == "not ours"
    last = torch.load(tmp_path / "last.ckpt", weights_only=False)
    for update in (4, 6, 8):
        ckpt = torch.load(tmp_path / f"update{update:07d}.ckpt", weights_only=False)
        assert ckpt["global_step"] == update and set(ckpt) == set(last)
        assert torch.equal(ckpt["state_dict"]["w"], probe.weights[update])
    assert not torch.equal(probe.weights[6], probe.weights[8])


def test_interval_checkpoints_are_not_written_by_fast_dev_run_and_keep_minus_one_keeps_all(tmp_path):
    trainer, _ = interval_trainer(tmp_path / "fdr", IntervalCheckpoints(every_n_updates=1), fast_dev_run=3)
    trainer.fit(Trains())
    assert not list((tmp_path / "fdr").glob("update*"))
    trainer, _ = interval_trainer(tmp_path / "all", IntervalCheckpoints(every_n_updates=3, keep=-1), max_steps=9)
    trainer.fit(Trains())
    assert sorted(p.name for p in (tmp_path / "all").glob("update*")) == [
        f"update{u:07d}.ckpt" for u in (3, 6, 9)]


@pytest.mark.parametrize("every,keep", [(-1, 3), (2, 0), (2, -2)])
def test_interval_checkpoints_refuse_settings_that_mean_nothing(every, keep):
    with pytest.raises(SeqmixError, match="must be"):
        IntervalCheckpoints(every_n_updates=every, keep=keep)
