"""last.ckpt follows training epoch by epoch, not only when the best score improves; epoch checkpoints every epoch."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from seqmix.training.checkpoints import LastCheckpoint

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
