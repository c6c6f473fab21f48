"""Turning a composed run config into built objects: the model, the task around it, a task from a checkpoint.

This is the one place that knows which model a task family needs (an encoder-decoder preset, or its decoder alone
for language modeling) and which config sections become a task's constructor arguments; tasks and models receive
built objects and never read the run config.
"""

from __future__ import annotations

import os
from dataclasses import fields, replace
from pathlib import Path
from typing import TypeVar

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from torch import nn

from seqmix.config.schema import TRAIN, check
from seqmix.data import Tokenizer, TranslationDataModule
from seqmix.errors import SeqmixError
from seqmix.generation.options import BeamOptions, NATOptions
from seqmix.metrics import BleuOptions, RougeOptions
from seqmix.models import DecoderOnly
from seqmix.models.adaptive import AdaptiveOptions
from seqmix.models.compiled import check_decoding_setting, check_setting
from seqmix.models.nat import NATModel
from seqmix.tasks import LanguageModelingTask, SummarizationTask, TranslationTask
from seqmix.tasks.nat_translation import NonAutoregressiveTranslationTask
from seqmix.training.checkpoints import average_checkpoints, latest_checkpoints, load_checkpoint

T = TypeVar("T")


def task_class(cfg: DictConfig) -> type:
    """The task's LightningModule class (``task.module._target_``)."""
    return get_class(cfg.task.module._target_)


def build_model(cfg: DictConfig, target_vocab_size: int, padding_idx: int,
                source_vocab_size: int | None = None) -> nn.Module:
    """The model of ``cfg.model`` for the task: a language model is the preset's decoder alone
    (``DecoderOnly.from_preset``); every other task gets the preset itself, with a source vocabulary of
    ``source_vocab_size`` (None: one joint vocabulary)."""
    if issubclass(task_class(cfg), LanguageModelingTask):
        preset = OmegaConf.to_container(cfg.model, resolve=True)
        if preset.get("decoder") is not None:  # its mixer configs become the layers' mixer factories
            preset["decoder"] = instantiate(preset["decoder"], _convert_="all")
        return DecoderOnly.from_preset(target_vocab_size, padding_idx, preset,
                                       from_config(cfg, "adaptive", AdaptiveOptions))
    check_model_fits_data(cfg)
    return instantiate(cfg.model, src_vocab_size=source_vocab_size or target_vocab_size,
                       tgt_vocab_size=target_vocab_size, padding_idx=padding_idx)


def check_model_fits_data(cfg: DictConfig) -> None:
    """A non-autoregressive translation model needs parallel (source, target) data."""
    model, data = get_class(cfg.model._target_), get_class(cfg.task.data._target_)
    if isinstance(model, type) and issubclass(model, NATModel) and not issubclass(data, TranslationDataModule):
        raise SeqmixError(f"model={cfg.model.name} is a non-autoregressive translation model; task="
                          f"{cfg.task.name} reads {data.__name__}, not parallel data: choose a translation task")


def model_from_config(cfg: DictConfig) -> nn.Module:
    """The model ``python train.py ... dry_run=true`` reports: vocabulary size from ``task.vocab_size``."""
    return build_model(cfg, int(cfg.task.vocab_size), padding_idx=1)


def from_config(cfg: DictConfig, key: str, cls: type[T]) -> T:
    """``cls`` from ``cfg.task.<key>`` (absent or null: its defaults); a key it does not know is a user error."""
    node = cfg.task.get(key)
    given = {} if node is None else OmegaConf.to_container(node, resolve=True)
    allowed = [f.name for f in fields(cls)]
    unknown = set(given) - set(allowed)
    if unknown:
        raise SeqmixError(f"unknown task.{key} keys {sorted(unknown)}; allowed: {allowed}")
    return cls(**given)


def task_options(cls: type, cfg: DictConfig) -> dict:
    """The constructor arguments a task class takes from the run config, beyond model, tokenizer and optimizer."""
    if issubclass(cls, LanguageModelingTask):
        data = cfg.task.data
        return {"tokens_per_sample": int(data.tokens_per_sample), "break_mode": str(data.break_mode),
                "eval_context": int(data.eval_context)}
    if not issubclass(cls, TranslationTask):
        return {}
    options = {"label_smoothing": cfg.label_smoothing, "generation": from_config(cfg, "generation", BeamOptions)}
    eval_generation = cfg.task.get("eval_generation")
    if eval_generation:
        options["eval_generation"] = OmegaConf.to_container(eval_generation, resolve=True)
    if issubclass(cls, SummarizationTask):
        options.update(rouge=from_config(cfg, "rouge", RougeOptions),
                       truncate_source=cfg.task.data.get("truncate_source"))
    else:
        options["bleu"] = bleu_options(cfg)
    if issubclass(cls, NonAutoregressiveTranslationTask):
        options["nat"] = from_config(cfg, "nat", NATOptions)
    if cls.compute_loss is TranslationTask.compute_loss:  # tasks with their own loss never take the option
        options["fused_loss"] = bool(cfg.get("fused_loss", False))
    return options


def bleu_options(cfg: DictConfig) -> BleuOptions:
    """``task.bleu``, with the target language the papers' tokenized BLEU tokenizes taken from ``task.tgt_lang``."""
    try:
        options = from_config(cfg, "bleu", BleuOptions)
    except ValueError as e:  # a kind the papers' BLEU does not know (train.py's schema check names it first)
        raise SeqmixError(str(e)) from None
    return options if options.lang else replace(options, lang=cfg.task.get("tgt_lang"))


def build_task(cfg: DictConfig, tokenizer, model: nn.Module | None = None):
    """The configured task around ``model`` (built from the config when None)."""
    cls = task_class(cfg)
    if model is None:
        # separate source/target vocabularies (fairseq dictionaries) where the tokenizer has them
        source = getattr(tokenizer, "source_vocab_size", tokenizer.vocab_size)
        target = getattr(tokenizer, "target_vocab_size", tokenizer.vocab_size)
        model = build_model(cfg, target, tokenizer.pad, source_vocab_size=source)
    factory = instantiate(cfg.task.module)  # a partial: the run config must reach it uninstantiated
    task = factory(model=model, tokenizer=tokenizer, optimizer=instantiate(cfg.optim),
                   scheduler=instantiate(cfg.scheduler) if cfg.get("scheduler") else None,
                   run_config=to_container(cfg), **task_options(cls, cfg))
    # every task has these (SeqmixTask): set here rather than through each task's constructor
    task.compile_training = check_setting(cfg.get("compile", False))
    task.compile_decoding = check_decoding_setting(cfg.get("compile_decoding", False))
    task.nonfinite, task.nonfinite_skip_limit = nonfinite_policy(cfg)
    return task


def nonfinite_policy(cfg: DictConfig) -> tuple[str, int]:
    """The top-level ``nonfinite`` (raise | skip) and ``nonfinite_skip_limit`` (skipped updates in a row that stop
    the run), checked by the schema's rules also where a config is built without train.py's check."""
    check(cfg, {key: TRAIN[key] for key in ("nonfinite", "nonfinite_skip_limit")})
    return cfg.get("nonfinite", "raise"), cfg.get("nonfinite_skip_limit", 10)


def to_container(cfg: DictConfig) -> dict:
    """The run config as plain data (what checkpoints store)."""
    return OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)


def load_task(ckpt_path: str | os.PathLike, average_last: int = 0,
              average_updates: bool = False) -> tuple[object, DictConfig]:
    """(task with its model in eval mode, training config) from a checkpoint, or from the mean of the latest
    ``average_last`` epoch checkpoints beside it (``average_updates``: interval checkpoints, update<N>.ckpt)."""
    if average_last and average_last > 1:
        asked = "average_last={n} average_updates=true" if average_updates else "average_last={n}"
        ckpt = average_checkpoints(latest_checkpoints(Path(ckpt_path).parent, average_last, asked, average_updates))
    else:
        ckpt = load_checkpoint(ckpt_path)
    return task_from_checkpoint(ckpt, str(ckpt_path))


def task_from_checkpoint(ckpt: dict, name: str) -> tuple[object, DictConfig]:
    """(task with its model in eval mode, training config) from a loaded (or averaged) seqmix checkpoint; ``name``
    says which in an error."""
    meta = ckpt["seqmix"]
    train_cfg = OmegaConf.create(meta["config"])
    task = build_task(train_cfg, Tokenizer.from_json(meta["tokenizer"]))
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    missing, unexpected = task.model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SeqmixError(f"checkpoint {name} does not match its own model config "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]}); it is corrupt or from another version")
    task.eval()
    return task, train_cfg
