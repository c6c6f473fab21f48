"""Checkpoints, one module: reading them with clear errors, writing them whole or not at all, last.ckpt and
interrupted.ckpt during training, averaging, and the checks before resuming or starting from one."""

from __future__ import annotations

import errno
import inspect
import logging
import os
import pydoc
import re
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from seqmix.errors import SeqmixError
from seqmix.files import atomic_write
from seqmix.tasks.base import CHECKPOINT_FORMAT, weights_finite

log = logging.getLogger(__name__)


def load_checkpoint(path: str | os.PathLike) -> dict:
    """A Lightning checkpoint written by seqmix (model weights, config and tokenizer inside)."""
    path = Path(path)
    if not path.is_file():
        raise SeqmixError(f"checkpoint {path} does not exist; pass ckpt_path=<run dir>/checkpoints/best.ckpt "
                          "(or last.ckpt) of a finished run")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # truncated file, wrong format, ...
        raise SeqmixError(f"checkpoint {path} is unreadable or corrupt ({type(err).__name__}: {err}); "
                          "use another checkpoint of the run (last.ckpt or an epoch*.ckpt)") from None
    problems = checkpoint_problems(ckpt)
    if problems:
        raise SeqmixError(f"{path} is not a complete seqmix checkpoint ({'; '.join(problems)}); use another "
                          "checkpoint of the run (last.ckpt, best.ckpt or an epoch*.ckpt)")
    ckpt["seqmix"]["config"] = upgraded_config(ckpt["seqmix"]["config"])
    return ckpt


def checkpoint_problems(ckpt) -> list[str]:
    """What a seqmix checkpoint lacks of what loading it needs: the weights, the run config (with its task and model)
    and the tokenizer, in a format this version reads. Empty when nothing is missing."""
    if not isinstance(ckpt, dict):
        return [f"it holds a {type(ckpt).__name__}, not a checkpoint"]
    problems = [] if isinstance(ckpt.get("state_dict"), dict) else ["no model weights (state_dict)"]
    meta = ckpt.get("seqmix")
    if not isinstance(meta, dict):
        return [*problems, "no seqmix entry (run config and tokenizer): not written by seqmix"]
    config = meta.get("config")
    if not isinstance(config, dict):
        problems.append("no run config")
    else:
        problems += [f"no {key} settings in its run config" for key in ("task", "model")
                     if not isinstance(config.get(key), dict)]
    if not isinstance(meta.get("tokenizer"), str) or not meta["tokenizer"].strip():
        problems.append("no tokenizer")
    if meta.get("format", CHECKPOINT_FORMAT) != CHECKPOINT_FORMAT:
        problems.append(f"checkpoint format {meta.get('format')!r}, this seqmix reads {CHECKPOINT_FORMAT}: decode it "
                        "with the seqmix version that wrote it")
    return problems


# model settings added after checkpoints were written: one without the setting was trained with this value
LEGACY_MODEL_SETTINGS = {"decoder_start": "bos"}
# classes that moved since checkpoints were written (module prefix of a ``_target_`` -> today's)
MOVED_MODULES = {
    "seqmix.mixers.disco.": "seqmix.models.disco_attention.",
    "seqmix.mixers.convs2s.": "seqmix.models.glu_conv.",
    "seqmix.callbacks.": "seqmix.training.checkpoints.",
    "seqmix.dashboard.": "seqmix.training.dashboard.",
    "seqmix.progress.": "seqmix.training.progress.",
    "seqmix.stop_min_lr.": "seqmix.training.stop_min_lr.",
    "seqmix.data.SummarizationDataModule": "seqmix.data.TranslationDataModule",
}


def _moved(node):
    if isinstance(node, dict):
        return {k: _moved_target(v) if k == "_target_" else _moved(v) for k, v in node.items()}
    return [_moved(v) for v in node] if isinstance(node, list) else node


def _moved_target(target):
    for old, new in MOVED_MODULES.items():
        if isinstance(target, str) and target.startswith(old):
            return new + target.removeprefix(old)
    return target


def _takes(target: str, key: str) -> bool:
    """Whether the class or function named ``target`` has a parameter ``key``."""
    try:
        return key in inspect.signature(pydoc.locate(target)).parameters
    except (pydoc.ErrorDuringImport, ValueError, TypeError):  # nothing of that name (None), or no signature
        return False


def upgraded_config(config: dict) -> dict:
    """A checkpoint's run config as today's code reads it: moved classes under their new names, and model settings
    added since at the value the checkpoint was trained with (only where today's model class takes them)."""
    config = _moved(config)
    model = config.get("model")
    if isinstance(model, dict) and isinstance(model.get("_target_"), str):
        added = {k: v for k, v in LEGACY_MODEL_SETTINGS.items() if k not in model and _takes(model["_target_"], k)}
        config = {**config, "model": {**model, **added}} if added else config
    return config


def _resumable(ckpt: dict) -> bool:
    return "optimizer_states" in ckpt and "loops" in ckpt


def newest_resumable_in(folder: Path, but: Path | None = None) -> tuple[Path, dict] | None:
    """The most recently written checkpoint in ``folder`` (other than ``but``) that loads and resumes, loaded."""
    if not folder.is_dir():
        return None
    candidates = [p for p in folder.glob("*.ckpt") if but is None or p.resolve() != but.resolve()]
    for candidate in sorted(candidates, key=lambda p: p.stat().st_mtime_ns, reverse=True):
        try:
            ckpt = load_checkpoint(candidate)
        except SeqmixError:
            continue
        if _resumable(ckpt):
            return candidate, ckpt
    return None


def newest_resumable_beside(path: str | os.PathLike) -> Path | None:
    """The most recently written checkpoint in ``path``'s folder, other than ``path``, that loads and resumes."""
    found = newest_resumable_in(Path(path).parent, but=Path(path))
    return None if found is None else found[0]


def remove_orphaned_writes(directory: Path) -> None:
    """Delete the temp files of checkpoint writes a kill interrupted (``seqmix.files.atomic_write`` names them
    ``.<name>.<random>.tmp``): each is as large as a checkpoint, and nothing else would ever remove them."""
    orphans = list(directory.glob(".*.ckpt.*.tmp")) if directory.is_dir() else []
    if orphans:
        size = sum(p.stat().st_size for p in orphans)
        for p in orphans:
            p.unlink(missing_ok=True)
        log.info("removed %d unfinished checkpoint write(s) from %s (%.1f MB)", len(orphans), directory, size / 1e6)


def check_resumable(path: str | os.PathLike) -> dict:
    """Fail before training starts, not mid-way, when a resume checkpoint is missing or corrupt, and name the newest
    good checkpoint beside it (e.g. the epoch checkpoint before a last.ckpt a crash cut short). Unfinished writes
    beside it are removed. Returns the checkpoint (for ``check_fits``)."""
    remove_orphaned_writes(Path(path).parent)
    try:
        ckpt = load_checkpoint(path)
    except SeqmixError as err:
        fallback = newest_resumable_beside(path)
        if fallback is None:
            raise
        raise SeqmixError(f"{err}. The newest good checkpoint beside it: resume with ckpt_path={fallback}") from None
    if not _resumable(ckpt):
        raise SeqmixError(f"{path} holds weights only (no optimizer/loop state): it cannot be resumed; "
                          "start a new run from it instead")
    return ckpt


def _check_task_and_vocabulary(task, ckpt: dict, option: str) -> None:
    """The same task, decoder start symbol and vocabulary as this run's."""
    trained = ((ckpt["seqmix"].get("config") or {}).get("task") or {}).get("name")
    own_task = ((getattr(task, "run_config", None) or {}).get("task") or {}).get("name")
    if trained and own_task and trained != own_task:
        raise SeqmixError(f"{option} was trained on task {trained}, this run is task {own_task}: pass "
                          f"task={trained} (and the model settings it was trained with)")
    trained_start = ((ckpt["seqmix"].get("config") or {}).get("model") or {}).get("decoder_start")
    own_start = getattr(getattr(task, "model", None), "decoder_start", None)
    if own_start is not None and trained_start is not None and trained_start != own_start:
        raise SeqmixError(f"{option} was trained with model.decoder_start={trained_start} (its decoder's first input), "
                          f"this run has {own_start}: pass model.decoder_start={trained_start}")
    if ckpt["seqmix"].get("tokenizer") != task.tokenizer.to_json():
        path = option.partition("=")[2] or "<that checkpoint>"
        raise SeqmixError(f"{option}: its vocabulary differs from this run's; pass task.data.tokenizer.file={path} "
                          "to take its vocabulary, or train on the data it was trained with (same task and "
                          "task.vocab_size)")


def check_fits(task, ckpt: dict, option: str) -> None:
    """``option`` (``ckpt_path=...`` or ``init_from=...``) names a checkpoint of this task, vocabulary and model:
    every parameter name and shape must match (a silent partial load would train garbage, and Lightning's own
    refusal is a page of size mismatches)."""
    _check_task_and_vocabulary(task, ckpt, option)
    own, theirs = task.state_dict(), ckpt["state_dict"]
    problems = [f"missing {k}" for k in own if k not in theirs]
    problems += [f"unexpected {k}" for k in theirs if k not in own]
    problems += [f"{k}: shape {tuple(theirs[k].shape)} vs {tuple(own[k].shape)}"
                 for k in own if k in theirs and theirs[k].shape != own[k].shape]
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise SeqmixError(f"{option} does not fit this model ({shown}); use the model settings it was trained with")


# what an encoder computes besides its weights: a teacher's encoder means the same only under the same settings
ENCODER_SETTINGS = ("embed_dim", "positions", "scale_embedding", "encoder.layers", "encoder.heads", "encoder.ffn_dim",
                    "encoder.normalize_before", "encoder.activation")
ENCODER = "model.encoder."


def _setting(model_cfg: dict, dotted: str):
    value = model_cfg or {}
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def load_encoder(task, path: str | os.PathLike) -> list[str]:
    """Start this model's encoder (with the embedding table it shares) from another model's checkpoint on the same
    task and vocabulary, e.g. a non-autoregressive student from its autoregressive teacher; the rest keeps its
    initialisation. Refused unless the encoders compute alike (``ENCODER_SETTINGS``) and every teacher encoder
    weight has a place of its shape. Returns the student's encoder weights left as initialised."""
    option = f"init_encoder_from={path}"
    ckpt = load_checkpoint(path)
    _check_task_and_vocabulary(task, ckpt, option)
    theirs_cfg = (ckpt["seqmix"].get("config") or {}).get("model") or {}
    own_cfg = ((getattr(task, "run_config", None) or {}).get("model")) or {}
    differ = [f"model.{k}={_setting(theirs_cfg, k)}" for k in ENCODER_SETTINGS
              if _setting(theirs_cfg, k) != _setting(own_cfg, k)]
    if differ:
        raise SeqmixError(f"{option}: its encoder was built with other settings; pass {' '.join(differ)}")
    own = {k: v for k, v in task.state_dict().items() if k.startswith(ENCODER)}
    theirs = {k: v for k, v in ckpt["state_dict"].items() if k.startswith(ENCODER)}
    problems = [f"no place for {k}" for k in theirs if k not in own]
    problems += [f"{k}: shape {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in theirs.items()
                 if k in own and not _fits(v.shape, own[k].shape, k)]
    if problems or not theirs:
        shown = "; ".join(problems[:3]) or "it has no encoder"
        raise SeqmixError(f"{option} does not fit this model's encoder ({shown}); give an encoder-decoder "
                          "checkpoint with the same encoder size")
    with torch.no_grad():
        for k, v in theirs.items():
            own[k][: v.size(0)].copy_(v)  # a student's extra symbols (CMLM's mask) keep their rows
    return [k for k in own if k not in theirs]


def _fits(theirs: torch.Size, own: torch.Size, key: str) -> bool:
    """Equal shapes, or the embedding table with extra rows in the student."""
    return theirs == own or (key.endswith("embed_tokens.weight") and len(theirs) == len(own) == 2
                             and theirs[1] == own[1] and theirs[0] <= own[0])


def load_weights(task, path: str | os.PathLike) -> None:
    """Start a new run from the model weights of ``path`` (fairseq's ``--restore-file`` with optimizer, lr
    schedule and counters reset, e.g. to fine-tune or anneal with another schedule)."""
    ckpt = load_checkpoint(path)
    check_fits(task, ckpt, f"init_from={path}")
    task.load_state_dict(ckpt["state_dict"])


def average_checkpoints(paths: list[str | os.PathLike]) -> dict:
    """Element-wise mean of the model weights of ``paths``; other fields come from the last one."""
    if not paths:
        raise SeqmixError("no checkpoints to average")
    ckpts = [load_checkpoint(p) for p in paths]
    shapes = {k: tuple(v.shape) for k, v in ckpts[-1]["state_dict"].items()}
    keys = list(shapes)
    for p, c in zip(paths, ckpts):
        if {k: tuple(v.shape) for k, v in c["state_dict"].items()} != shapes:
            raise SeqmixError(f"cannot average {p}: its parameters (names or shapes) differ from {paths[-1]}'s; "
                              "average checkpoints of one run")
    averaged = dict(ckpts[-1])
    state = {}
    for k in keys:
        tensors = [c["state_dict"][k] for c in ckpts]
        if tensors[0].is_floating_point():
            state[k] = torch.stack([t.double() for t in tensors]).mean(0).to(tensors[0].dtype)
        else:
            state[k] = tensors[-1]
    averaged["state_dict"] = state
    return averaged


# what only resuming needs: an averaged checkpoint is for decoding, exporting or init_from, never for resuming
TRAINING_STATE = ("optimizer_states", "lr_schedulers", "loops", "callbacks")


def write_averaged(paths: list[str | os.PathLike], out: str | os.PathLike) -> dict:
    """The mean of ``paths``' weights as a checkpoint file ``out`` that generate.py, the exporters and init_from read
    (the run config and tokenizer of the last one; no optimizer or loop state), written atomically; ``out`` must not
    exist yet. Returns what was written."""
    out = Path(out)
    if out.exists():
        raise SeqmixError(f"{out} exists; give --out a new file name (nothing was overwritten)")
    averaged = {k: v for k, v in average_checkpoints(paths).items() if k not in TRAINING_STATE}
    averaged["seqmix"] = {**averaged["seqmix"], "averaged_from": [Path(p).name for p in paths]}
    try:
        atomic_write(out, lambda f: torch.save(averaged, f))
    except OSError as err:
        raise SeqmixError(f"could not write {out} ({err.strerror or err}); nothing half-written was left") from None
    return averaged


def _epoch_checkpoints(directory: Path) -> list[Path]:
    def step_of(p: Path) -> int:
        try:
            return int(p.stem.rsplit("step", 1)[1])
        except (IndexError, ValueError):
            return -1
    return sorted(directory.glob("epoch*-step*.ckpt"), key=step_of)


# update<N>.ckpt: IntervalCheckpoints' files, unlike any other checkpoint name of a run (epoch*, last, best, ...)
INTERVAL_NAME = re.compile(r"update(\d+)\.ckpt")


def interval_checkpoint_name(updates: int) -> str:
    """Zero-padded, so that a listing shows them in update order."""
    return f"update{updates:07d}.ckpt"


def interval_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """The interval checkpoints (``update<N>.ckpt``) in ``directory``, by update count."""
    named = [(INTERVAL_NAME.fullmatch(p.name), p) for p in Path(directory).glob("update*.ckpt")]
    return [p for _, p in sorted((int(match.group(1)), p) for match, p in named if match)]


def latest_checkpoints(directory: str | os.PathLike, n: int, asked: str = "average_last={n}",
                       updates: bool = False) -> list[Path]:
    """The ``n`` epoch checkpoints with the highest step in ``directory`` (``updates``: the ``n`` interval checkpoints
    with the most updates), oldest first; ``asked``: the setting that asked for them, as the error names it."""
    directory = Path(directory)
    if updates:
        found, kind = interval_checkpoints(directory), "interval checkpoints (update*.ckpt)"
        more = f"save_interval_updates=<K> and keep_interval_updates>={n} (or -1)"
    else:
        found, kind, more = _epoch_checkpoints(directory), "epoch checkpoints", f"keep_last_epochs>={n}"
    if len(found) < n:
        raise SeqmixError(f"{asked.format(n=n)} but {directory} holds only {len(found)} {kind}; "
                          f"train with {more} or ask for fewer")
    return found[-n:]


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        try:
            atomic_write(path, lambda f: torch.save(checkpoint, f))
        except OSError as err:
            hint = "free some disk space" if err.errno in (errno.ENOSPC, errno.EDQUOT) else "check the output folder"
            raise SeqmixError(f"could not write checkpoint {path} ({err.strerror or err}): {hint}, then resume "
                              "from the run's last good checkpoint (ckpt_path=<run dir>/checkpoints/last.ckpt); "
                              "nothing half-written was left") from None


log = logging.getLogger("seqmix")


def _checkpoint_dir(trainer: L.Trainer) -> Path | None:
    for cb in trainer.checkpoint_callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.dirpath:
            return Path(cb.dirpath)
    return None


def _save_in_run(trainer: L.Trainer, name: str) -> Path | None:
    """The trainer's whole state (what resuming reads) as ``name`` in the run's checkpoints folder, atomically
    (AtomicCheckpointIO); nothing before the first update, while sanity checking or under fast_dev_run, as Lightning's
    own ModelCheckpoint. Returns the file written."""
    directory = _checkpoint_dir(trainer)
    if directory is None or trainer.global_step == 0 or trainer.sanity_checking or trainer.fast_dev_run:
        return None
    trainer.save_checkpoint(directory / name, weights_only=False)  # the whole state, said without a log line
    return directory / name


def _update_due(trainer: L.Trainer, every: int, saved_step: int) -> bool:
    """An update count that is a multiple of ``every`` (0: never) and not yet saved: ``on_train_batch_end`` sees the
    same count over the batches one update accumulates, and this answers once."""
    step = trainer.global_step
    return bool(every) and step % every == 0 and step != saved_step


class _OncePerUpdate(Checkpoint):
    """Saves at most once per update count; a resumed run's first count is its checkpoint's, saved already (with
    gradient accumulation, saving it again after the update's first batch would record a place in the epoch past
    batches whose gradients the file does not hold)."""

    _saved_step = -1

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._saved_step = trainer.global_step


class LastCheckpoint(_OncePerUpdate):
    """last.ckpt after every training epoch (its validation included), every ``every_n_updates`` optimizer updates
    within epochs (0: never; WMT epochs are hours) and when training ends, mid-epoch too (max_steps, max_time);
    interrupted.ckpt when training dies (exception, Ctrl-C). A run killed outright (OOM killer, preemption) thus
    loses at most an epoch or ``every_n_updates`` updates, and resumes at the batch it stopped at (the loader's
    place is in the checkpoint: seqmix.data.resumable_loader). ModelCheckpoint's own last.ckpt is only rewritten
    when it saves a top-k checkpoint, i.e. when the best score improves. List it after the ModelCheckpoints (as
    conf/callbacks does): Lightning runs checkpoint callbacks last, in their order, so the saved state holds their
    view of this epoch's validation (ModelCheckpoint itself saves at the train epoch's end when validating every
    epoch)."""

    def __init__(self, last_name: str = "last.ckpt", interrupted_name: str = "interrupted.ckpt",
                 every_n_updates: int = 0) -> None:
        if every_n_updates < 0:
            raise SeqmixError(f"every_n_updates={every_n_updates} must be >= 0 (0: only at epoch ends)")
        self.last_name = last_name
        self.interrupted_name = interrupted_name
        self.every_n_updates = every_n_updates
        self.last_path = ""  # where last.ckpt was written, once it was
        self.interrupted_path = ""  # where interrupted.ckpt was written, once it was
        self._saved_step = -1

    def _save_last(self, trainer: L.Trainer) -> None:
        path = _save_in_run(trainer, self.last_name)
        if path is not None:
            self.last_path = str(path)
            self._saved_step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        if _update_due(trainer, self.every_n_updates, self._saved_step):
            self._save_last(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save_last(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save_last(trainer)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        directory = _checkpoint_dir(trainer)
        if directory is None or trainer.global_step == 0:
            return
        if isinstance(exception, MisconfigurationException):  # a setting to fix: nothing to resume from
            return
        if not weights_finite(pl_module):
            log.warning("weights are not finite: not writing %s", self.interrupted_name)
            return
        path = directory / self.interrupted_name
        try:
            trainer.save_checkpoint(path)
        except (OSError, SeqmixError) as err:  # e.g. the full disk that stopped the run: report the first error
            log.warning("could not write %s: %s", path, err)
            return
        self.interrupted_path = str(path)
        log.warning("training stopped by %s; state saved to %s (resume with ckpt_path=%s)",
                    type(exception).__name__, path, path)


class IntervalCheckpoints(_OncePerUpdate):
    """update<N>.ckpt every ``every_n_updates`` optimizer updates (0: never), fairseq's ``--save-interval-updates``,
    for averaging the last checkpoints by update (``python -m seqmix.average <run> --updates --last N``) where an
    epoch is hours long; the newest ``keep`` are kept (``--keep-interval-updates``; -1: all). Each holds what
    last.ckpt holds (written by the same call at the same point), so each resumes as last.ckpt does. Only files named
    as it names them, in the run's checkpoints folder, are deleted, and only once the new one is whole. List it after
    the ModelCheckpoints (as conf/callbacks does), as LastCheckpoint."""

    def __init__(self, every_n_updates: int = 0, keep: int = -1) -> None:
        if every_n_updates < 0:
            raise SeqmixError(f"every_n_updates={every_n_updates} must be >= 0 (0: no interval checkpoints)")
        if keep == 0 or keep < -1:
            raise SeqmixError(f"keep={keep} must be -1 (keep all) or >= 1 (the newest N)")
        self.every_n_updates = every_n_updates
        self.keep = keep
        self._saved_step = -1

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        if not _update_due(trainer, self.every_n_updates, self._saved_step):
            return
        path = _save_in_run(trainer, interval_checkpoint_name(trainer.global_step))
        if path is None:
            return
        self._saved_step = trainer.global_step
        if self.keep > 0 and trainer.is_global_zero:  # save_checkpoint returned: the new file is whole on disk
            for old in interval_checkpoints(path.parent)[:-self.keep]:
                if old != path:
                    old.unlink(missing_ok=True)
