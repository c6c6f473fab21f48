"""The paper's lr annealing (Gehring et al. 2017 §4.2): ×0.1 after every validation that did not improve, stepped
by Lightning once per validation epoch on the monitored metric."""

from __future__ import annotations

import functools

import lightning as L
import pytest
import torch

from seqmix.tasks import TranslationTask
from seqmix.tasks.schedulers import inverse_sqrt, reduce_on_plateau


def nag(lr: float = 0.25) -> torch.optim.SGD:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr, momentum=0.99, nesterov=True)


def test_lr_shrinks_after_every_validation_without_improvement():
    opt = nag()
    config = reduce_on_plateau(opt, factor=0.1, min_lr=1e-5)
    assert config["monitor"] == "val/nll" and config["interval"] == "epoch"
    scheduler = config["scheduler"]
    losses = [5.0, 4.0, 4.2, 3.5, 3.5, 3.6, 3.0, 3.1, 3.2, 3.3]
    best, lr, expected, seen = float("inf"), 0.25, [], []
    for loss in losses:
        scheduler.step(loss)
        if loss < best:
            best = loss
        else:  # patience 0: every validation that does not beat the best shrinks the lr
            lr = max(lr * 0.1, 1e-5)
        expected.append(lr)
        seen.append(opt.param_groups[0]["lr"])
    assert seen == pytest.approx(expected, rel=1e-9)
    assert seen[-3:] == pytest.approx([2.5e-5, 1e-5, 1e-5])  # five shrinks from 0.25, then the floor


class _Tokenizer:
    pad, bos, eos, unk = 1, 0, 2, 3


@pytest.mark.parametrize("every", [1, 3])
def test_task_steps_a_plateau_schedule_once_per_validation(every):
    task = TranslationTask(torch.nn.Linear(2, 2), _Tokenizer(), optimizer=functools.partial(torch.optim.SGD, lr=0.25),
                           scheduler=functools.partial(reduce_on_plateau, monitor="val/loss"))
    task.trainer = L.Trainer(check_val_every_n_epoch=every, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False)
    config = task.configure_optimizers()["lr_scheduler"]
    assert isinstance(config["scheduler"], torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert config["monitor"] == "val/loss" and config["interval"] == "epoch" and config["frequency"] == every


def test_task_keeps_per_update_schedules():
    task = TranslationTask(torch.nn.Linear(2, 2), _Tokenizer(), optimizer=functools.partial(torch.optim.Adam, lr=1e-3),
                           scheduler=functools.partial(inverse_sqrt, warmup_updates=10))
    config = task.configure_optimizers()["lr_scheduler"]
    assert config["interval"] == "step" and isinstance(config["scheduler"], torch.optim.lr_scheduler.LambdaLR)
