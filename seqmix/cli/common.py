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
