"""stop_min_lr: training ends once reduce-on-plateau has annealed the lr to the floor, checkpoints intact."""

from __future__ import annotations

import logging

import lightning as L
import pytest
import torch
from hydra.utils import instantiate

from seqmix.errors import SeqmixError
from seqmix.tasks.schedulers import reduce_on_plateau
from seqmix.training.checkpoints import LastCheckpoint
from seqmix.training.stop_min_lr import StopAtMinLR
from tests.test_configs import compose_train

BATCHES = 3


class Plateau(L.LightningModule):
    """A linear model whose validation loss never improves after the first validation."""

    def __init__(self, floor: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.floor = floor

    def training_step(self, batch, batch_idx):
        return self.layer(batch).square().mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", 1.0)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.25)
        return {"optimizer": opt, "lr_scheduler": reduce_on_plateau(opt, monitor="val/loss", min_lr=self.floor)}

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(BATCHES, 2), batch_size=1)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(1, 2), batch_size=1)


def fit(tmp_path, stop_min_lr: float, floor: float = 0.0, max_epochs: int = 8) -> L.Trainer:
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path, filename="best", monitor="val/loss")
    trainer = L.Trainer(max_epochs=max_epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, callbacks=[ckpt, LastCheckpoint(), StopAtMinLR(stop_min_lr)])
    trainer.fit(Plateau(floor))
    return trainer


def test_training_stops_when_the_annealed_lr_reaches_the_floor(tmp_path, caplog):
    """lr 0.25 → 0.025 → 0.0025 (the scheduler's floor, up to float rounding: 0.0025000000000000005) after
    validations 2 and 3: no epoch runs after that; lr <= stop_min_lr as fairseq, so the floor itself stops it."""
    with caplog.at_level(logging.INFO, logger="seqmix"):
        trainer = fit(tmp_path, stop_min_lr=0.0025, floor=0.0025)
    assert trainer.global_step == 3 * BATCHES
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.0025)
    assert (tmp_path / "best.ckpt").is_file() and (tmp_path / "last.ckpt").is_file()
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["global_step"] == 3 * BATCHES
    lines = [r.getMessage() for r in caplog.records if "stop_min_lr" in r.getMessage()]
    assert len(lines) == 1 and "after epoch 3: learning rate 0.0025 reached stop_min_lr=0.0025" in lines[0], lines


def test_off_by_default_and_above_the_lr(tmp_path):
    assert fit(tmp_path / "off", stop_min_lr=0.0, max_epochs=4).global_step == 4 * BATCHES
    # annealed to 2.5e-5 .. floor 0 within 4 epochs, never to 1e-6
    assert fit(tmp_path / "low", stop_min_lr=1e-6, max_epochs=4).global_step == 4 * BATCHES


def test_negative_threshold_is_refused():
    with pytest.raises(SeqmixError, match="stop_min_lr"):
        StopAtMinLR(-1.0)


@pytest.mark.parametrize("experiment,expected", [(None, 0.0), ("gehring2017_convs2s_wmt_ende", 1e-4),
                                                 ("gehring2017_convs2s_wmt_enfr", 1e-4),
                                                 ("gehring2017_convs2s_wmt16_enro", 1e-4),
                                                 ("gehring2017_convs2s_iwslt14_deen", 1e-5)])
def test_config_wires_the_callback(experiment, expected):
    """Off by default; the ConvS2S paper presets stop where §4.2 does (once the lr falls below 1e-4), the IWSLT one
    (fairseq's recipe, not the paper's) where fairseq-py did (lr <= 1e-5); either is the plateau schedule's floor."""
    cfg = compose_train([f"experiment={experiment}"] if experiment else [])
    assert cfg.stop_min_lr == expected
    if experiment:  # the stop is the plateau schedule's floor: the run ends right after its last annealing
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.25)
        assert instantiate(cfg.scheduler)(opt)["scheduler"].min_lrs == [expected]
    callback = instantiate(cfg.callbacks.stop_min_lr)
    assert isinstance(callback, StopAtMinLR) and callback.min_lr == expected
