"""`python train.py`: compose the config, build data/model/task, fit, score the best checkpoint."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, open_dict

from seqmix.cli.common import module_summary, output_dir_of, remove_empty_run_folder
from seqmix.config.build import build_task, model_from_config, to_container
from seqmix.config.download import suggest_download
from seqmix.config.mixer_group import settle_mixer_choice
from seqmix.config.runtime import job_overrides
from seqmix.config.schema import check_train_config
from seqmix.errors import SeqmixError
from seqmix.models import count_parameters
from seqmix.training.checkpoints import (
    AtomicCheckpointIO,
    LastCheckpoint,
    check_fits,
    check_resumable,
    load_encoder,
    load_weights,
    newest_resumable_in,
    remove_orphaned_writes,
)
from seqmix.training.preemption import Preemption, cluster_environment
from seqmix.training.run_record import finish_record, record_evaluation, start_record

log = logging.getLogger("seqmix")


def dry_run(cfg: DictConfig) -> int:
    """Build the model from the config alone (vocabulary size from task.vocab_size) and report its size; nothing
    is run, so no run folder is left."""
    model = model_from_config(cfg)
    n = count_parameters(model)
    print(module_summary(model))
    print(f"parameters: {n}")
    remove_empty_run_folder(cfg)
    return n


def instantiate_callbacks(cfg: DictConfig, loggers: list) -> list:
    """The configured callbacks; without a logger (``logger=none``) not the learning-rate monitor, which Lightning
    refuses there and which would have nothing to log to."""
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None and "_target_" in c]
    return [c for c in callbacks if loggers or not isinstance(c, LearningRateMonitor)]


def instantiate_loggers(cfg: DictConfig) -> list:
    return [instantiate(c) for c in (cfg.get("logger") or {}).values() if c is not None and "_target_" in c]


def finish_wandb() -> None:
    """One wandb run per job: close it so the next multirun job starts its own."""
    if "wandb" in sys.modules:
        import wandb

        if wandb.run is not None:
            wandb.finish()


def data_for_fitting(cfg: DictConfig):
    """The task's data module, set up to fit; files it misses that `download=true` fetches say so in one line."""
    with suggest_download(cfg.task, job_overrides()):
        datamodule = instantiate(cfg.task.data, _convert_="all")
        datamodule.setup("fit")
    return datamodule


def check_starting_points(cfg: DictConfig) -> None:
    """At most one of: resume (ckpt_path), all weights (init_from), the encoder alone (init_encoder_from)."""
    if cfg.get("ckpt_path") and cfg.get("init_from"):
        raise SeqmixError("ckpt_path resumes a run (optimizer, schedule and step count too) and init_from starts a "
                          "new run from a checkpoint's weights: pass one of them")
    if cfg.get("init_encoder_from") and (cfg.get("ckpt_path") or cfg.get("init_from")):
        raise SeqmixError("init_encoder_from starts a new model's encoder; with ckpt_path (resume) or init_from (all "
                          "weights) it would be overwritten: pass one of them")


def start_from_weights(task, cfg: DictConfig) -> None:
    """``init_from`` (every weight) or ``init_encoder_from`` (the encoder and its embeddings) into a new run."""
    if cfg.get("init_from"):
        load_weights(task, cfg.init_from)
        log.info("model weights from %s (new optimizer, schedule and step count)", cfg.init_from)
    if cfg.get("init_encoder_from"):
        fresh = load_encoder(task, cfg.init_encoder_from)
        log.info("encoder weights from %s%s", cfg.init_encoder_from,
                 f" (left as initialised: {', '.join(fresh)})" if fresh else "")


def train(cfg: DictConfig) -> float | None:
    """Train per ``cfg``; returns the task's final score (BLEU, perplexity, ROUGE-L; for sweeps), with run_test=false
    its best validation score, or None."""
    settle_mixer_choice(cfg)
    check_train_config(cfg)  # types and ranges, before anything is built or written
    if cfg.dry_run:
        dry_run(cfg)
        return None
    check_starting_points(cfg)
    start_record(output_dir_of(cfg), job_overrides(), list(cfg.get("tags") or []), model=cfg.model.name,
                 task=cfg.task.name, precision=str(cfg.trainer.precision))
    resume_from = continue_run_in_its_folder(cfg)
    if resume_from is None and cfg.get("ckpt_path"):
        resume_from = check_resumable(cfg.ckpt_path)
    L.seed_everything(cfg.seed, workers=True)

    datamodule = data_for_fitting(cfg)
    task = build_task(cfg, datamodule.tokenizer)
    if resume_from is not None:
        check_fits(task, resume_from, f"ckpt_path={cfg.ckpt_path}")
        del resume_from  # Lightning reads it again when fit starts
    start_from_weights(task, cfg)
    log.info("model %s: %s parameters", cfg.model.name, f"{count_parameters(task.model):,}")
    print(f"parameters: {count_parameters(task.model)}")
    loggers = instantiate_loggers(cfg)
    callbacks = instantiate_callbacks(cfg, loggers)
    plugins = {} if cfg.trainer.get("plugins") else {"plugins": [AtomicCheckpointIO(), *cluster_environment()]}
    trainer: L.Trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, **plugins)
    preemption = Preemption(requeue=cfg.get("slurm_requeue", True))
    preemption.install()
    try:
        try:
            trainer.fit(task, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
        except SIGTERMException:
            stopped_by_signal(trainer, preemption)
        if trainer.interrupted:
            raise SeqmixError("training was interrupted; resume with ckpt_path=<run dir>/checkpoints/last.ckpt")
        score = final_evaluation(cfg, trainer, task, datamodule) if cfg.run_test else None
        if trainer.is_global_zero:
            record_results(cfg, trainer, task)
        if score is None:  # run_test=false: the best validation score (what a sweeper such as Optuna optimizes)
            best = getattr(trainer.checkpoint_callback, "best_model_score", None)
            score = None if best is None else float(best)
        return score
    finally:
        finish_wandb()


# what must match for resume=auto to continue a run: the rest (trainer limits, logging, ...) may change
_SAME_RUN = ("task", "model", "optim", "scheduler", "seed", "label_smoothing")
def _differences(theirs, ours, key: str) -> list[str]:
    """The dotted settings where a run folder's config and this run's differ, each as ``key=theirs (here: ours)``,
    so the message says what to pass to continue that run."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        return [d for k in sorted(set(theirs) | set(ours), key=str)
                for d in _differences(theirs.get(k), ours.get(k), f"{key}.{k}")]
    return [] if theirs == ours else [f"{key}={theirs} (here: {ours})"]


def continue_run_in_its_folder(cfg: DictConfig) -> dict | None:
    """``resume: auto``: a run folder that already holds a checkpoint of this run (a requeued SLURM job's
    ``runs/slurm-<job>``, or ``hydra.run.dir`` given again) continues from its newest good checkpoint, as fairseq
    continues from ``checkpoint_last.pt`` in its save dir. Sets ``cfg.ckpt_path`` and returns the loaded
    checkpoint (None when there is nothing to continue)."""
    if cfg.get("ckpt_path") or cfg.get("init_from") or cfg.get("resume", "auto") == "never":
        return None
    if cfg.resume != "auto":
        raise SeqmixError(f"resume must be auto or never, got {cfg.resume!r}")
    out = output_dir_of(cfg)
    if out is None:
        return None
    remove_orphaned_writes(out / "checkpoints")
    found = newest_resumable_in(out / "checkpoints")
    if found is None:
        return None
    path, ckpt = found
    ours = to_container(cfg)
    theirs = ckpt["seqmix"]["config"]
    differ = [d for key in _SAME_RUN for d in _differences(theirs.get(key), ours.get(key), key)]
    if differ:
        shown = ", ".join(differ[:4]) + (f" and {len(differ) - 4} more" if len(differ) > 4 else "")
        raise SeqmixError(f"the run folder {out} already holds a run with other settings ({shown}; its newest "
                          f"checkpoint is {path}): give this run its own folder (hydra.run.dir=...) or continue that "
                          "run with its own settings")
    log.warning("continuing the run in %s from %s (resume=auto)", out, path)
    with open_dict(cfg):
        cfg.ckpt_path = str(path)
    return ckpt


def stopped_by_signal(trainer: L.Trainer, preemption: Preemption) -> None:
    """A preempted run: one line saying where its state is and how to resume (or that the requeued SLURM job
    will), exit status 143 (terminated)."""
    saved = next((cb.interrupted_path for cb in trainer.callbacks if isinstance(cb, LastCheckpoint)), "")
    where = f"state saved to {saved}; resume with ckpt_path={saved}" if saved else "no checkpoint was written"
    requeued = preemption.requeue(trainer.is_global_zero) if saved else ""
    print(f"seqmix: stopped by a signal (SIGTERM or SIGUSR1) after update {trainer.global_step}: {where}{requeued}",
          file=sys.stderr, flush=True)
    if saved:
        preemption.after_stop()
    sys.exit(128 + signal.SIGTERM)


def record_results(cfg: DictConfig, trainer: L.Trainer, task) -> None:
    """The finished run's record (``seqmix.training.run_record``): what a sweep report tabulates."""
    checkpoints = trainer.checkpoint_callback
    best = getattr(checkpoints, "best_model_score", None)
    report = task.reports.get(task.test_split) if cfg.run_test else None
    finish_record(
        output_dir_of(cfg),
        score=None if report is None else float(report.score),
        score_name=None if report is None else report.headline.split(":")[0],
        split=task.test_split if report is not None else None,
        best_valid=None if best is None else float(best),
        monitor=getattr(checkpoints, "monitor", None),
        parameters=count_parameters(task.model),
        updates=int(trainer.global_step),
        epochs=int(trainer.current_epoch),
        tokens_per_s=round(task.timed_tokens / task.timed_seconds, 1) if task.timed_seconds else None,
        checkpoint=getattr(checkpoints, "best_model_path", None) or None,
    )


def final_evaluation(cfg: DictConfig, trainer: L.Trainer, task, datamodule) -> float | None:
    """Score the best checkpoint (last if none is 'best') on test, or on valid when there is no test split."""
    split = "test" if "test" in datamodule.datasets else "valid"
    ckpt = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    if not ckpt:  # no validation scored a best checkpoint: the last one
        ckpt = next((cb.last_path for cb in trainer.callbacks if isinstance(cb, LastCheckpoint)), "")
    task.test_split = split
    task.reference_source = datamodule
    trainer.test(task, dataloaders=datamodule.dataloader(split), ckpt_path=ckpt or None, verbose=False)
    report = task.reports.get(split)
    if trainer.is_global_zero:
        if report is not None:
            print(f"{split} {report.headline}")
            for line in report.details:
                print(line)
        print(f"checkpoint: {ckpt or '(none saved)'}")
        if report is not None:
            record_evaluation(output_dir_of(cfg), split, task.decoding_settings(), Path(ckpt).name if ckpt else "",
                              report.metrics, report.details)
    return None if report is None else report.score
