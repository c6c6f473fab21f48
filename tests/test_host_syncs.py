"""No host sync per training update. On a GPU every read of a tensor back to the host waits for the queued work, so
a tiny translation task is trained here under Lightning with the GPU policy (``reads_freely`` false: padding masks
kept rather than looked at) and every tensor read is counted: reads happen only at the updates the intervals name
(the progress bar's, the non-finite guard's, the logger's), and the bar shows the last loss it read in between."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

from seqmix.errors import SeqmixError
from seqmix.layers import padding
from seqmix.training.progress import ProgressBar
from tests.tasks.test_fused_loss import BATCH, tiny_task

UPDATES = 10
READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__")


def train(bar: ProgressBar, finite_interval: int, tmp_path, monkeypatch, log_every: int = 1000):
    """Train UPDATES updates; return the per-update losses, the global steps at which a tensor was read back during
    training, and (global step, loss shown by the bar) after each training batch."""
    monkeypatch.setattr(padding, "reads_freely", lambda device: False)
    task = tiny_task(fused=True)
    task.optimizer_factory = functools.partial(torch.optim.SGD, lr=0.05)
    task.finite_check_interval = finite_interval
    losses, reads, shown, running = [], [], [], {}
    step = task.training_step

    def training_step(batch, batch_idx):
        out = step(batch, batch_idx)
        losses.append(float(out.detach().clone().numpy()))  # numpy: not one of the counted reads
        return out

    task.training_step = training_step
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            trainer_ = running.get("trainer")
            if trainer_ is not None and trainer_.training:
                reads.append(trainer_.global_step)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)

    class Recorder(L.Callback):
        def on_train_batch_end(self, trainer_, pl_module, *args):
            shown.append((trainer_.global_step, bar._shown.get("train/loss")))

    batch = {**BATCH, "id": torch.arange(2), "ntokens": 8}
    logger = CSVLogger(tmp_path) if log_every < UPDATES else False
    trainer = L.Trainer(max_steps=UPDATES, logger=logger, enable_checkpointing=False, enable_model_summary=False,
                        callbacks=[bar, Recorder()], default_root_dir=str(tmp_path), log_every_n_steps=log_every,
                        limit_val_batches=0, num_sanity_val_steps=0)
    running["trainer"] = trainer
    trainer.fit(task, train_dataloaders=torch.utils.data.DataLoader([batch] * UPDATES, batch_size=None))
    return losses, reads, shown


def test_tensors_are_read_only_at_the_interval_updates_and_the_bar_shows_the_last_read(tmp_path, monkeypatch):
    losses, reads, shown = train(ProgressBar(metrics_interval=4), 4, tmp_path, monkeypatch)
    # the bar: its first update (nothing to show yet), every 4th, the epoch's last batch; the non-finite guard:
    # in the training step of every 4th update (global step 3 and 7 while it runs)
    # (global step 0: Lightning's set-up reads CPU tensors once before the first update: data lengths, loader seed)
    assert sorted(set(reads)) == [0, 1, 3, 4, 7, 8, 10]
    bar_reads = (1, 4, 8, 10)
    for step, loss in shown:
        read = max(s for s in bar_reads if s <= step)
        assert loss == pytest.approx(losses[read - 1]), step
    assert len(shown) == UPDATES and losses[-1] < losses[0]


def test_the_logger_and_the_guard_are_the_only_readers_at_interval_50(tmp_path, monkeypatch):
    """Intervals longer than the run: one read by the bar at its first update and one at the last batch; the logger
    (every 5 updates) reads at its own updates."""
    _, reads, _ = train(ProgressBar(metrics_interval=50), 50, tmp_path, monkeypatch, log_every=5)
    assert sorted(set(reads)) == [0, 1, 5, 10]


@pytest.mark.parametrize("fused", [True, False])
def test_keeping_an_all_false_padding_mask_changes_nothing(monkeypatch, fused):
    """The GPU policy (masks kept) and the CPU one (masks dropped when nothing is padded) give the same loss and
    gradients, on a batch with pads and on one without (float64)."""
    unpadded = {key: value[:1] for key, value in BATCH.items()}
    results = {}
    for policy in (True, False):
        monkeypatch.setattr(padding, "reads_freely", lambda device, policy=policy: policy)
        for name, batch in (("padded", BATCH), ("unpadded", unpadded)):
            task = tiny_task(fused)
            loss, nll, _ = task.compute_loss(batch)
            (loss + nll).backward()
            results[policy, name] = [loss.detach(), nll.detach(), *(p.grad for p in task.parameters())]
    assert padding.padding_or_none(BATCH["target"][:1].eq(1)) is not None  # the GPU policy still in force here
    for name in ("padded", "unpadded"):
        for cpu, gpu in zip(results[True, name], results[False, name]):
            torch.testing.assert_close(gpu, cpu, rtol=1e-12, atol=1e-12)


def test_default_interval_is_every_update_on_cpu_and_50_elsewhere(tmp_path, monkeypatch):
    bar = ProgressBar()
    assert bar._interval(SimpleNamespace(device=torch.device("cpu"))) == 1
    assert bar._interval(SimpleNamespace(device=torch.device("cuda", 0))) == 50
    losses, _, shown = train(bar, 1, tmp_path, monkeypatch)
    assert [loss for _, loss in shown] == pytest.approx(losses)
    with pytest.raises(SeqmixError, match="metrics_interval"):
        ProgressBar(metrics_interval=0)


def test_the_run_config_uses_it():
    from hydra import compose, initialize_config_dir

    from tests.conftest import ROOT

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train")
    assert cfg.callbacks.progress_bar._target_ == "seqmix.training.progress.ProgressBar"
