"""Reading seqmix checkpoints with clear errors, averaging several of them, and a task from one."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from seqmix.data import Tokenizer
from seqmix.errors import SeqmixError
from seqmix.tasks.factory import build_task

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
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "seqmix" not in ckpt:
        raise SeqmixError(f"{path} is not a seqmix checkpoint (no model weights/config/tokenizer inside)")
    return ckpt


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


def check_fits(task, ckpt: dict, option: str) -> None:
    """``option`` (``ckpt_path=...`` or ``init_from=...``) names a checkpoint of this task, vocabulary and model:
    every parameter name and shape must match (a silent partial load would train garbage, and Lightning's own
    refusal is a page of size mismatches)."""
    trained = ((ckpt["seqmix"].get("config") or {}).get("task") or {}).get("name")
    own_task = ((getattr(task, "run_config", None) or {}).get("task") or {}).get("name")
    if trained and own_task and trained != own_task:
        raise SeqmixError(f"{option} was trained on task {trained}, this run is task {own_task}: pass "
                          f"task={trained} (and the model settings it was trained with)")
    # a checkpoint written before decoder_start existed was trained from bos (today's default is eos)
    trained_start = ((ckpt["seqmix"].get("config") or {}).get("model") or {}).get("decoder_start", "bos")
    own_start = getattr(getattr(task, "model", None), "decoder_start", None)
    if own_start is not None and trained_start != own_start:
        raise SeqmixError(f"{option} was trained with model.decoder_start={trained_start} (its decoder's first input), "
                          f"this run has {own_start}: pass model.decoder_start={trained_start}")
    if ckpt["seqmix"].get("tokenizer") != task.tokenizer.to_json():
        raise SeqmixError(f"{option}: its vocabulary differs from this run's; train on the data and vocabulary the "
                          "checkpoint was trained with (same task and task.vocab_size)")
    own, theirs = task.state_dict(), ckpt["state_dict"]
    problems = [f"missing {k}" for k in own if k not in theirs]
    problems += [f"unexpected {k}" for k in theirs if k not in own]
    problems += [f"{k}: shape {tuple(theirs[k].shape)} vs {tuple(own[k].shape)}"
                 for k in own if k in theirs and theirs[k].shape != own[k].shape]
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise SeqmixError(f"{option} does not fit this model ({shown}); use the model settings it was trained with")


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
    keys = list(ckpts[-1]["state_dict"])
    for p, c in zip(paths, ckpts):
        if list(c["state_dict"]) != keys:
            raise SeqmixError(f"cannot average {p}: its parameters differ from {paths[-1]}")
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


def latest_epoch_checkpoints(directory: str | os.PathLike, n: int) -> list[Path]:
    """The ``n`` epoch checkpoints with the highest step in ``directory`` (oldest first)."""
    def step_of(p: Path) -> int:
        try:
            return int(p.stem.rsplit("step", 1)[1])
        except (IndexError, ValueError):
            return -1
    found = sorted((p for p in Path(directory).glob("epoch*-step*.ckpt")), key=step_of)
    if len(found) < n:
        raise SeqmixError(f"average_last={n} but {directory} holds only {len(found)} epoch checkpoints; "
                          f"train with keep_last_epochs>={n} or lower average_last")
    return found[-n:]


def load_task(ckpt_path: str | os.PathLike, average_last: int = 0) -> tuple[object, DictConfig]:
    """(task with its model in eval mode, training config) from a checkpoint, or from the mean of the latest
    ``average_last`` epoch checkpoints beside it."""
    if average_last and average_last > 1:
        ckpt = average_checkpoints(latest_epoch_checkpoints(Path(ckpt_path).parent, average_last))
    else:
        ckpt = load_checkpoint(ckpt_path)
    meta = ckpt["seqmix"]
    train_cfg = OmegaConf.create(meta["config"])
    task = build_task(train_cfg, Tokenizer.from_json(meta["tokenizer"]))
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    missing, unexpected = task.model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SeqmixError(f"checkpoint {ckpt_path} does not match its own model config "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]}); it is corrupt or from another version")
    task.eval()
    return task, train_cfg
