"""Exact resume: a train.py run killed with SIGKILL at a chosen update and resumed from its latest checkpoint, or
stopped by SIGTERM / SIGUSR1 and resumed from the checkpoint it wrote, trains on the batches an uninterrupted run
would, in the same order, and ends with bitwise-equal weights and optimizer state (CPU, same threads; dropout
on, so the random generators must be restored too)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from tests.helpers import TINY, describe, fake_scontrol, run

pytestmark = pytest.mark.slow

STEPS = 30
BASE = [*TINY, "task.data.max_tokens=512", f"trainer.max_steps={STEPS}", "trainer.max_epochs=-1", "run_test=false",
        "trainer.limit_val_batches=1", "model.dropout=0.1", "+callbacks.probe._target_=tests.resume_probe.BatchProbe"]


def train(log_dir: Path, *extra: str, kill_after: int = -1, signal_name: str = "SIGKILL", env: dict | None = None):
    return run("train.py", [*BASE, f"+callbacks.probe.path={log_dir / 'batches.jsonl'}",
                            f"+callbacks.probe.kill_after={kill_after}", f"+callbacks.probe.signal_name={signal_name}",
                            *extra], log_dir, env=env)


def batches(log_dir: Path) -> dict[int, tuple[int, list[int]]]:
    """update -> (epoch, example ids) as trained; a resumed update's record replaces the killed run's."""
    records = [json.loads(line) for line in (log_dir / "batches.jsonl").read_text().splitlines()]
    return {step: (epoch, ids) for epoch, step, ids in records}


def last_checkpoint(log_dir: Path) -> Path:
    """The newest last.ckpt under ``log_dir`` (each run writes its own run folder)."""
    return max(log_dir.rglob("checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime_ns)


def same_training(resumed_dir: Path, whole: Path) -> None:
    """Every update of the interrupted and resumed runs on the uninterrupted run's batch, and equal end states."""
    assert batches(resumed_dir) == batches(whole)
    ours, theirs = (torch.load(last_checkpoint(d), weights_only=False) for d in (resumed_dir, whole))
    assert ours["global_step"] == theirs["global_step"] == STEPS
    for name, value in theirs["state_dict"].items():
        assert torch.equal(ours["state_dict"][name], value), name
    for ours_state, theirs_state in zip(ours["optimizer_states"][0]["state"].values(),
                                        theirs["optimizer_states"][0]["state"].values()):
        assert all(torch.equal(ours_state[k], v) for k, v in theirs_state.items())


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("uninterrupted")
    proc = train(log_dir)
    assert proc.returncode == 0, describe(proc)
    return log_dir


@pytest.mark.parametrize("where", ["mid-epoch", "after an epoch's end"])
def test_a_killed_run_resumes_exactly(whole, tmp_path, where):
    expected = batches(whole)
    epochs = [epoch for epoch, _ in expected.values()]
    assert len(expected) == STEPS and epochs[-1] >= 2, "the run should span epochs"
    end_of_first = epochs.count(0)  # updates in an epoch
    if where == "mid-epoch":  # last.ckpt every 4 updates; killed after update 4k+1, inside epoch 1
        every, kill_after = 4, 4 * ((end_of_first + 6) // 4) + 1
        resumed_at = kill_after - 1
        assert end_of_first < resumed_at < 2 * end_of_first
    else:  # last.ckpt only at epoch ends; killed 2 updates into epoch 2
        every, kill_after = 0, 2 * end_of_first + 2
        resumed_at = 2 * end_of_first
    killed = train(tmp_path, f"callbacks.last_checkpoint.every_n_updates={every}", kill_after=kill_after)
    assert killed.returncode == -signal.SIGKILL, describe(killed)
    ckpt = last_checkpoint(tmp_path)
    assert torch.load(ckpt, weights_only=False)["global_step"] == resumed_at
    resumed = train(tmp_path, f"callbacks.last_checkpoint.every_n_updates={every}", f"ckpt_path={ckpt}")
    assert resumed.returncode == 0, describe(resumed)
    assert "not resumable" not in resumed.stderr + resumed.stdout

    same_training(tmp_path, whole)


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGUSR1"])
def test_a_signalled_run_saves_its_state_exits_and_resumes_exactly(whole, tmp_path, signal_name):
    stopped = train(tmp_path, kill_after=11, signal_name=signal_name)
    assert stopped.returncode == 128 + signal.SIGTERM, describe(stopped)
    lines = [line for line in stopped.stderr.splitlines() if line.startswith("seqmix:")]
    assert len(lines) == 1 and "after update 11" in lines[0] and "Traceback" not in stopped.stderr, describe(stopped)
    saved = lines[0].rsplit("ckpt_path=", 1)[1]
    assert Path(saved).name == "interrupted.ckpt"
    assert torch.load(saved, weights_only=False)["global_step"] == 11
    assert not list(tmp_path.rglob("FAILED"))
    resumed = train(tmp_path, f"ckpt_path={saved}")
    assert resumed.returncode == 0, describe(resumed)
    same_training(tmp_path, whole)


def fake_slurm_job(tmp_path: Path, job: str) -> tuple[dict, Path]:
    """The environment of a one-task SLURM batch job, with an ``scontrol`` on PATH that records its arguments."""
    bin_dir, calls, _ = fake_scontrol(tmp_path)
    env = {"SLURM_JOB_ID": job, "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "seqmix", "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return env, calls

def test_a_slurm_job_warned_by_sigusr1_requeues_itself_and_the_requeued_job_continues_exactly(whole, tmp_path):
    """In a SLURM batch job, SIGUSR1 (``#SBATCH --signal=USR1@90``) ends the update, writes interrupted.ckpt in
    runs/slurm-<job id> and runs ``scontrol requeue <job id>`` (a stand-in on PATH records it); the requeued job,
    the same command with the same job id, continues that run by itself, on the uninterrupted run's batches."""
    slurm, calls = fake_slurm_job(tmp_path, "4242")
    first = train(tmp_path, kill_after=11, signal_name="SIGUSR1", env=slurm)
    assert first.returncode == 128 + signal.SIGTERM, describe(first)
    lines = [line for line in first.stderr.splitlines() if line.startswith("seqmix:")]
    assert len(lines) == 1 and "SLURM job 4242 requeued" in lines[0], describe(first)
    assert calls.read_text().split() == ["requeue", "4242"]
    folder = tmp_path / "runs" / "slurm-4242"
    assert torch.load(folder / "checkpoints" / "interrupted.ckpt", weights_only=False)["global_step"] == 11

    requeued = train(tmp_path, env={**slurm, "SLURM_RESTART_COUNT": "1"})
    assert requeued.returncode == 0, describe(requeued)
    assert "continuing the run in" in requeued.stdout + requeued.stderr
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["slurm-4242"]
    assert calls.read_text().split() == ["requeue", "4242"]  # nothing asked for another requeue
    same_training(tmp_path, whole)


def test_sigterm_in_a_slurm_job_saves_but_does_not_requeue(tmp_path):
    """SIGTERM is what ``scancel`` sends: the state is saved, the job is not requeued."""
    slurm, calls = fake_slurm_job(tmp_path, "77")
    stopped = train(tmp_path, kill_after=5, signal_name="SIGTERM", env=slurm)
    assert stopped.returncode == 128 + signal.SIGTERM, describe(stopped)
    assert (tmp_path / "runs" / "slurm-77" / "checkpoints" / "interrupted.ckpt").is_file()
    line = next(line for line in stopped.stderr.splitlines() if line.startswith("seqmix:"))
    assert "requeue" not in line and not calls.exists(), describe(stopped)
