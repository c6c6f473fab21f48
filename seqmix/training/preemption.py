"""Preemption: a signal stops training between two updates, the state goes to interrupted.ckpt, and under SLURM the
job requeues itself and the requeued job continues the same run.

SLURM warns a job before killing it when asked (``#SBATCH --signal=USR1@90``: SIGUSR1 90 s ahead) and sends SIGTERM
when it preempts or cancels it. Lightning's own SLURM auto-requeue saves its checkpoint *inside* the SIGUSR1
handler, i.e. wherever the main thread happens to be (possibly half-way through an optimizer step); it installs
that handler only where SIGUSR1 has none, so seqmix's, installed first, replaces it and does things in order: SIGUSR1 → Lightning's graceful SIGTERM path (the update finishes, the loop
stops, interrupted.ckpt is written with the loader's place) → ``scontrol requeue <job>`` → exit. The requeued job
keeps its job id, so its run folder (``runs/slurm-<job>``, see ``slurm_job_folder``) is the same, and
``resume: auto`` continues from the newest good checkpoint in it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess

from lightning.pytorch.plugins.environments import SLURMEnvironment

log = logging.getLogger("seqmix")


class Preemption:
    """Turns the warning signals into Lightning's graceful stop and remembers whether a requeue was asked for:
    SIGUSR1 (``#SBATCH --signal=USR1@90``), or the signal a submitit job (``hydra/launcher=slurm``) is warned with
    (USR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise). submitit's own handler would requeue and exit at once,
    wherever training is; it is kept and called after the stop instead (``after_stop``): it requeues the job, which
    reruns in the same job folder, where ``resume: auto`` continues."""

    def __init__(self, requeue: bool) -> None:
        self.requeue_enabled = requeue
        self.requeue_requested = False
        self.submitit_handler = None  # (signal, submitit's handler) in a submitit job

    def install(self) -> None:
        def stop_then_requeue(signum, frame) -> None:
            self.requeue_requested = True
            os.kill(os.getpid(), signal.SIGTERM)

        if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGUSR1, stop_then_requeue)
        if os.environ.get("SUBMITIT_EXECUTOR") == "slurm" and self.requeue_enabled:
            warning = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))
            previous = signal.getsignal(warning)
            if callable(previous):
                self.submitit_handler = (warning, previous)
                signal.signal(warning, stop_then_requeue)

    def requeue(self, is_global_zero: bool) -> str:
        """Requeue the SLURM job (rank 0 only) when a warning signal asked for it; what was done, for the final
        line."""
        if not (self.requeue_requested and self.requeue_enabled and on_slurm()):
            return ""
        job = slurm_job_id()
        if self.submitit_handler is not None:
            return f"; submitit requeues SLURM job {job}: it resumes from there by itself"
        if not is_global_zero:
            return f"; rank 0 requeues SLURM job {job}"
        try:
            done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"; could not requeue SLURM job {job} ({err}): resubmit it"
        if done.returncode != 0:
            reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            return f"; `scontrol requeue {job}` failed ({reason[0]}): resubmit the job"
        return f"; SLURM job {job} requeued: it resumes from there by itself"

    def after_stop(self) -> None:
        """In a submitit job, hand over to submitit's handler now that the state is saved (it requeues, then
        exits)."""
        if self.requeue_requested and self.submitit_handler is not None:
            warning, handler = self.submitit_handler
            handler(warning, None)


def on_slurm() -> bool:
    """A SLURM batch job (not an interactive ``srun --pty bash``/``salloc`` shell): Lightning's own test."""
    return SLURMEnvironment.detect()


def slurm_job_id() -> str:
    array_job = os.environ.get("SLURM_ARRAY_JOB_ID")
    if array_job is not None:
        return f"{array_job}_{os.environ.get('SLURM_ARRAY_TASK_ID', '0')}"
    return os.environ["SLURM_JOB_ID"]


def slurm_job_folder(otherwise: str) -> str:
    """Resolver for hydra.run.dir: ``slurm-<job id>`` in a SLURM batch job (the same again after a requeue), else
    ``otherwise`` (the timestamp)."""
    return f"slurm-{slurm_job_id()}" if on_slurm() else otherwise


def cluster_environment() -> list:
    """The Trainer's cluster plugin under SLURM: Lightning's SLURM environment without its own requeue handlers
    (seqmix's run instead; Lightning would only log that it sets them, then skip SIGUSR1, which is taken)."""
    return [SLURMEnvironment(auto_requeue=False)] if on_slurm() else []
