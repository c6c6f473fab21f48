"""Building a task and its model from a run config, as train.py, generate.py, the benchmarks and the tests do."""

from __future__ import annotations

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from seqmix.compile import check_setting
from seqmix.errors import SeqmixError
from seqmix.generation.compiled import check_decoding_setting


def build_model(model_cfg: DictConfig, src_vocab_size: int, tgt_vocab_size: int, padding_idx: int) -> nn.Module:
    """An encoder-decoder model preset (``conf/model``) for the given vocabularies."""
    return instantiate(model_cfg, src_vocab_size=src_vocab_size, tgt_vocab_size=tgt_vocab_size,
                       padding_idx=padding_idx)


def task_class(cfg: DictConfig) -> type:
    """The task's LightningModule class (``task.module._target_``): it knows how to build its model."""
    return get_class(cfg.task.module._target_)


def build_task(cfg: DictConfig, tokenizer, model: nn.Module | None = None):
    """The configured task around ``model`` (built from the config when None)."""
    cls = task_class(cfg)
    if model is None:
        # separate source/target vocabularies (fairseq dictionaries) where the tokenizer has them
        source = getattr(tokenizer, "source_vocab_size", tokenizer.vocab_size)
        target = getattr(tokenizer, "target_vocab_size", tokenizer.vocab_size)
        model = cls.build_model(cfg, target, tokenizer.pad, source_vocab_size=source)
    factory = instantiate(cfg.task.module)  # a partial: the run config must reach it uninstantiated
    task = factory(model=model, tokenizer=tokenizer, optimizer=instantiate(cfg.optim),
                   scheduler=instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
                   run_config=to_container(cfg), **cls.options_from_config(cfg))
    # every task has it (SeqmixTask), so it is set here rather than through each task's constructor
    task.compile_training = check_setting(cfg.get("compile", False))
    task.compile_decoding = check_decoding_setting(cfg.get("compile_decoding", False))
    task.nonfinite, task.nonfinite_skip_limit = nonfinite_policy(cfg)
    return task


def nonfinite_policy(cfg: DictConfig) -> tuple[str, int]:
    """The top-level ``nonfinite`` (raise | skip) and ``nonfinite_skip_limit`` (skipped updates in a row that stop
    the run), checked."""
    policy, limit = cfg.get("nonfinite", "raise"), cfg.get("nonfinite_skip_limit", 10)
    if policy not in ("raise", "skip"):
        raise SeqmixError(f"nonfinite must be raise or skip, got {policy!r}")
    if not isinstance(limit, int) or limit < 1:
        raise SeqmixError(f"nonfinite_skip_limit must be a positive number of updates, got {limit!r}")
    return policy, limit


def to_container(cfg: DictConfig) -> dict:
    """The run config as plain data (what checkpoints store)."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
