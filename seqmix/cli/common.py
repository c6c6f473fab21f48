"""Pieces shared by the train and generate commands: the run folder and the model summary."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from torch import nn

from seqmix.models import count_parameters


def module_summary(model: nn.Module, depth: int = 2) -> str:
    rows = []

    def walk(module: nn.Module, prefix: str, level: int) -> None:
        for name, child in module.named_children():
            full = f"{prefix}.{name}" if prefix else name
            rows.append(f"{'  ' * level}{full:<40} {type(child).__name__:<22} {count_parameters(child):>14,}")
            if level + 1 < depth:
                walk(child, full, level + 1)

    walk(model, "", 0)
    return "\n".join([f"{'module':<40} {'type':<22} {'parameters':>14}", *rows])


def output_dir_of(cfg: DictConfig) -> Path | None:
    try:
        return Path(cfg.paths.output_dir)
    except Exception:  # hydra runtime not available (direct calls in tests)
        return None


# what Hydra writes into every run folder before the job starts
HYDRA_RECORDS = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")


def remove_empty_run_folder(cfg: DictConfig) -> bool:
    """Remove this run's folder when it holds only what Hydra wrote before the job (``.hydra/`` and an empty job
    log), as after ``dry_run=true``: a folder without results must not be left to look like a run; so do the
    folders above it inside ``paths.log_dir`` (``runs/``) that it leaves empty. Any other file, or a log with
    something in it, keeps the folder whole. Returns whether it was removed."""
    out = output_dir_of(cfg)
    if out is None or not out.is_dir():
        return False
    files = [p for p in out.rglob("*") if not p.is_dir()]
    bookkeeping = [p for p in files if p.relative_to(out).as_posix() in HYDRA_RECORDS
                   or (p.parent == out and p.suffix == ".log" and p.is_file() and p.stat().st_size == 0)]
    if len(bookkeeping) != len(files):
        return False
    for p in bookkeeping:
        p.unlink()
    for folder in sorted((p for p in out.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        folder.rmdir()
    out.rmdir()
    try:
        log_dir = Path(cfg.paths.log_dir).resolve()
    except Exception:  # no paths group (direct calls in tests)
        return True
    parent = out.resolve().parent
    while parent != log_dir and parent.is_relative_to(log_dir) and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent
    return True
