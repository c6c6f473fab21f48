"""Two DDP processes (gloo, CPU) train the model one process trains with ``accumulate_grad_batches=2`` over the
same global batches: the sampler gives rank r the global batches r, r + 2, ..., DDP averages the two ranks'
gradients as accumulation averages two consecutive batches' (each batch's loss normalized by its own tokens),
so weights and optimizer state agree after every update, within fp32 rounding. Dropout is off: the two set-ups
draw their masks in different orders. The optimizer is NAG (SGD with momentum), linear in the gradients: Adam
would turn the rounding noise of gradients that are zero in exact arithmetic (attention's key bias) into
full-size steps that differ between any two summation orders."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import TINY, describe, run

pytestmark = pytest.mark.slow

STEPS = 6  # 12 of the first epoch's ~30 batches: no epoch end, where the two would pad or accumulate differently
COMMON = [*TINY, "task.data.max_tokens=128", "model.dropout=0.0", f"trainer.max_steps={STEPS}", "trainer.max_epochs=-1", "run_test=false",
          "trainer.limit_val_batches=0", "trainer.accelerator=cpu", "optim=nag",
          "optim.lr=0.1", "scheduler.warmup_updates=2"]


def final_state(log_dir: Path) -> dict:
    return torch.load(next(log_dir.rglob("checkpoints/last.ckpt")), weights_only=False)


def test_two_processes_train_like_one_accumulating_two_batches(tmp_path):
    ddp = run("train.py", [*COMMON, "trainer.devices=2", "trainer.strategy=ddp"], tmp_path / "ddp", timeout=900)
    assert ddp.returncode == 0, describe(ddp)
    one = run("train.py", [*COMMON, "trainer.devices=1", "trainer.accumulate_grad_batches=2"], tmp_path / "one")
    assert one.returncode == 0, describe(one)
    two, single = final_state(tmp_path / "ddp"), final_state(tmp_path / "one")
    assert two["global_step"] == single["global_step"] == STEPS
    for name, value in single["state_dict"].items():
        torch.testing.assert_close(two["state_dict"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    states = [(a, b) for a, b in zip(two["optimizer_states"][0]["state"].values(),
                                     single["optimizer_states"][0]["state"].values())]
    assert states and all("momentum_buffer" in a for a, _ in states)
    for a, b in states:
        torch.testing.assert_close(a["momentum_buffer"], b["momentum_buffer"], rtol=1e-4, atol=1e-7)
    # the comparison can fail: one process taking one batch per update ends elsewhere
    plain = run("train.py", [*COMMON, "trainer.devices=1"], tmp_path / "plain")
    assert plain.returncode == 0, describe(plain)
    apart = [name for name, value in final_state(tmp_path / "plain")["state_dict"].items()
             if not torch.allclose(value, single["state_dict"][name], rtol=1e-5, atol=1e-6)]
    assert len(apart) > len(single["state_dict"]) // 2
