"""Pieces shared by the train and generate entry points: error reporting and the model summary."""

from __future__ import annotations

import functools
import logging
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig
from torch import nn

from seqmix.errors import SeqmixError
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


def clean_failed_run(cfg: DictConfig, message: str) -> None:
    """A failed run must not look like a valid one: drop its folder if it holds no checkpoint, else mark it."""
    out = output_dir_of(cfg)
    if out is None or not out.exists():
        return
    if any(out.rglob("*.ckpt")):
        (out / "FAILED").write_text(message + "\n")
    else:
        logging.shutdown()
        shutil.rmtree(out, ignore_errors=True)


def user_error_in(err: BaseException | None) -> SeqmixError | None:
    """The SeqmixError behind ``err``, also when Hydra's instantiate wrapped it (errors raised while building)."""
    while err is not None and not isinstance(err, SeqmixError):
        err = err.__cause__ or err.__context__
    return err


def user_errors_exit(fn: Callable[[DictConfig], object]) -> Callable[[DictConfig], object]:
    """Turn a SeqmixError into one clear line on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(cfg: DictConfig):
        try:
            return fn(cfg)
        except Exception as raised:
            err = user_error_in(raised)
            if err is None:
                raise
            message = f"seqmix: error: {err}"
            print(message, file=sys.stderr, flush=True)
            clean_failed_run(cfg, message)
            sys.exit(2)

    return wrapper
