"""Pieces shared by the train and generate entry points: building the model and task, error reporting."""

from __future__ import annotations

import functools
import logging
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from seqmix.errors import SeqmixError
from seqmix.models import count_parameters

log = logging.getLogger("seqmix")


def build_model(model_cfg: DictConfig, src_vocab_size: int, tgt_vocab_size: int, padding_idx: int) -> nn.Module:
    return instantiate(model_cfg, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
                       padding_idx=padding_idx)


def task_class(cfg: DictConfig) -> type:
    """The task's LightningModule class (``task.module._target_``): it knows how to build its model."""
    return get_class(cfg.task.module._target_)


def build_task(cfg: DictConfig, tokenizer, model: nn.Module | None = None):
    """The configured task around ``model`` (built from the config when None), as train.py and generate.py use it."""
    cls = task_class(cfg)
    if model is None:
        model = cls.build_model(cfg, tokenizer.vocab_size, tokenizer.pad)
    factory = instantiate(cfg.task.module)  # a partial: the run config must reach it uninstantiated
    return factory(model=model, tokenizer=tokenizer, optimizer=instantiate(cfg.optim),
                   scheduler=instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
                   run_config=to_container(cfg), **cls.options_from_config(cfg))


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


def user_errors_exit(fn: Callable[[DictConfig], object]) -> Callable[[DictConfig], object]:
    """Turn a SeqmixError into one clear line on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(cfg: DictConfig):
        try:
            return fn(cfg)
        except SeqmixError as err:
            message = f"seqmix: error: {err}"
            print(message, file=sys.stderr, flush=True)
            clean_failed_run(cfg, message)
            sys.exit(2)

    return wrapper


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
