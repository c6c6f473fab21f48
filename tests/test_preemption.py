"""The requeue step of seqmix.training.preemption on its own: which job it names, when it acts, and what a failure says."""

from __future__ import annotations

import os
import signal

import pytest

from seqmix.training.preemption import Preemption, slurm_job_folder, slurm_job_id
from tests.helpers import fake_scontrol

BATCH_JOB = {"SLURM_JOB_ID": "31", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train"}


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """An ``scontrol`` on PATH that records its arguments and exits with the status written to ``status``."""
    bin_dir, calls, status = fake_scontrol(tmp_path)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls, status


def slurm_env(monkeypatch, **extra):
    for key in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in {**BATCH_JOB, **extra}.items():
        monkeypatch.setenv(key, value)


def test_the_job_and_its_folder_are_named_by_the_job_id_and_array_task(monkeypatch):
    slurm_env(monkeypatch)
    assert slurm_job_id() == "31" and slurm_job_folder("2026-01-01") == "slurm-31"
    slurm_env(monkeypatch, SLURM_ARRAY_JOB_ID="30", SLURM_ARRAY_TASK_ID="4")
    assert slurm_job_id() == "30_4" and slurm_job_folder("x") == "slurm-30_4"
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")  # an interactive allocation is not a batch job
    assert slurm_job_folder("2026-01-01") == "2026-01-01"
    monkeypatch.delenv("SLURM_NTASKS")
    assert slurm_job_folder("2026-01-01") == "2026-01-01"


def test_only_sigusr1_on_rank_zero_of_a_batch_job_requeues(monkeypatch, scontrol):
    calls, _ = scontrol
    slurm_env(monkeypatch)
    p = Preemption(requeue=True)
    assert p.requeue(is_global_zero=True) == "" and not calls.exists()  # SIGTERM (scancel): no requeue
    p.requeue_requested = True
    assert "rank 0 requeues SLURM job 31" in p.requeue(is_global_zero=False) and not calls.exists()
    assert "SLURM job 31 requeued" in p.requeue(is_global_zero=True)
    assert calls.read_text().split() == ["requeue", "31"]
    assert Preemption(requeue=False).requeue(is_global_zero=True) == ""


def test_a_failed_requeue_says_to_resubmit(monkeypatch, scontrol):
    _, status = scontrol
    status.write_text("1")
    slurm_env(monkeypatch)
    p = Preemption(requeue=True)
    p.requeue_requested = True
    said = p.requeue(is_global_zero=True)
    assert "scontrol requeue 31` failed (scontrol: error: denied)" in said and "resubmit" in said


def test_sigusr1_becomes_sigterm_and_marks_the_request(monkeypatch):
    received = []
    previous_usr1 = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    previous_term = signal.signal(signal.SIGTERM, lambda *_: received.append("TERM"))
    try:
        p = Preemption(requeue=True)
        p.install()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert p.requeue_requested and received == ["TERM"]
    finally:
        signal.signal(signal.SIGUSR1, previous_usr1)
        signal.signal(signal.SIGTERM, previous_term)


def test_in_a_submitit_job_its_warning_signal_stops_first_and_its_handler_requeues_after(monkeypatch):
    """submitit (hydra/launcher=slurm) warns with USR2 and would requeue and exit inside the handler, wherever
    training is: seqmix takes the signal, stops gracefully, and calls submitit's handler after the state is saved."""
    slurm_env(monkeypatch, SUBMITIT_EXECUTOR="slurm")
    monkeypatch.delenv("SUBMITIT_PREEMPT_SIGNAL", raising=False)
    events = []
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)}
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    signal.signal(signal.SIGUSR2, lambda signum, frame: events.append(("submitit", signum)))
    signal.signal(signal.SIGTERM, lambda *_: events.append(("graceful stop", signal.SIGTERM)))
    try:
        p = Preemption(requeue=True)
        p.install()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert events == [("graceful stop", signal.SIGTERM)] and p.requeue_requested
        assert "submitit requeues SLURM job 31" in p.requeue(is_global_zero=True)
        p.after_stop()
        assert events[-1] == ("submitit", signal.SIGUSR2)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
