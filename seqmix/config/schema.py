"""Types, ranges and allowed values of the config keys, checked right after composition, before anything is built or
written: a wrong value is one ``SeqmixError`` naming the key, the value and what is allowed, instead of an error deep
inside Lightning, the optimizer or a model (or, worse, a run that trains on nonsense).

Rules are glob patterns over dotted keys (``model.*.layers`` matches ``model.encoder.layers``; ``*`` also crosses
dots); a key may match several rules and must satisfy each. Keys no rule names are left to the code that reads them.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf
from sacrebleu import BLEU

from seqmix.data.fetch import CORPORA
from seqmix.data.lm_blocks import BREAK_MODES
from seqmix.data.tokenizer import TOKENIZER_KINDS
from seqmix.errors import SeqmixError
from seqmix.generation.options import NGRAM_UNITS
from seqmix.metrics.bleu import PAPER_BLEU_KINDS
from seqmix.metrics.chrf_ter import METRICS
from seqmix.models.blocks import ACTIVATIONS
from seqmix.models.quantized import QUANTIZE_CHOICES


class Rule:
    def describe(self) -> str:
        """What is allowed, e.g. "a whole number >= 1"."""
        raise NotImplementedError

    def allows(self, value) -> bool:
        raise NotImplementedError

    def problem(self, value) -> str | None:
        """None when ``value`` is allowed, else what is allowed."""
        return None if self.allows(value) else f"must be {self.describe()}"


@dataclass(frozen=True)
class Number(Rule):
    """An int or a finite float in [low, high] (``open_low``/``open_high`` exclude the bound); ``whole``: ints only."""

    low: float = -math.inf
    high: float = math.inf
    open_low: bool = False
    open_high: bool = False
    whole: bool = False

    def describe(self) -> str:
        kind = "a whole number" if self.whole else "a finite number"
        bounds = []
        if self.low > -math.inf:
            bounds.append(f"{'>' if self.open_low else '>='} {self.low:g}")
        if self.high < math.inf:
            bounds.append(f"{'<' if self.open_high else '<='} {self.high:g}")
        return f"{kind} {' and '.join(bounds)}".strip()

    def allows(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float) or (self.whole and not isinstance(value, int)):
            return False
        if not math.isfinite(value):
            return False
        below = value <= self.low if self.open_low else value < self.low
        above = value >= self.high if self.open_high else value > self.high
        return not (below or above)


@dataclass(frozen=True)
class Choice(Rule):
    values: tuple

    def describe(self) -> str:
        return f"one of {list(self.values)}"

    def allows(self, value) -> bool:
        if isinstance(value, bool) and not any(isinstance(v, bool) for v in self.values):
            return False  # True == 1, but true is not the choice 1
        return value in self.values


@dataclass(frozen=True)
class Kind(Rule):
    """A value of one Python type (``bool`` or ``str``), a non-empty string when ``str``."""

    type_: type

    def describe(self) -> str:
        return {bool: "true or false", str: "a non-empty string"}.get(self.type_, self.type_.__name__)

    def allows(self, value) -> bool:
        return isinstance(value, self.type_) and not (self.type_ is str and not value.strip())


@dataclass(frozen=True)
class Text(Rule):
    """A string matching ``pattern`` (whole), described as ``shape``."""

    pattern: str
    shape: str

    def describe(self) -> str:
        return self.shape

    def allows(self, value) -> bool:
        return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None


@dataclass(frozen=True)
class ListOf(Rule):
    item: Rule
    length: int | None = None
    min_length: int = 0

    def describe(self) -> str:
        size = f"{self.length} " if self.length is not None else ("non-empty " if self.min_length else "")
        return f"a list of {size}items, each {self.item.describe()}"

    def allows(self, value) -> bool:
        return isinstance(value, list | tuple) and (self.length is None or len(value) == self.length) \
            and len(value) >= self.min_length and all(self.item.allows(v) for v in value)


@dataclass(frozen=True)
class AnyOf(Rule):
    rules: tuple[Rule, ...]

    def describe(self) -> str:
        return " or ".join(r.describe() for r in self.rules)

    def allows(self, value) -> bool:
        return any(r.allows(value) for r in self.rules)


@dataclass(frozen=True)
class Described(Rule):
    """``rule`` described in the words of the setting (what a special value such as -1 means)."""

    rule: Rule
    words: str

    def describe(self) -> str:
        return self.words

    def allows(self, value) -> bool:
        return self.rule.allows(value)


def maybe(rule: Rule) -> Rule:
    """``rule``, or null."""
    return AnyOf((rule, Choice((None,))))


COUNT = Number(1, whole=True)
COUNT0 = Number(0, whole=True)
PROBABILITY = Number(0, 1, open_high=True)
FLAG = Kind(bool)
TEXT = Kind(str)
FINITE = Number()
NONNEGATIVE = Number(0)
SEED = Number(0, 2**32 - 1, whole=True)
ON_OFF_AUTO = AnyOf((FLAG, Choice(("auto",))))
MIN_MAX = Choice(("min", "max"))
KERNEL_SIZES = AnyOf((COUNT, ListOf(COUNT)))
# fairseq's --keep-*-updates: -1 keeps all (0 too in fairseq, which reads as "none": refused)
KEEP_ALL_OR_N = Described(AnyOf((Choice((-1,)), COUNT)), "-1 (keep all) or a whole number >= 1 (the newest N)")
PAPER_BLEU = maybe(AnyOf((Choice(PAPER_BLEU_KINDS), ListOf(Choice(PAPER_BLEU_KINDS), min_length=1))))

# A mixer's options, wherever a mixer is configured: the mixer group's node, a stack's mixer, a hybrid's legend
MIXER_OPTIONS = {
    "*dropout": PROBABILITY, "kernel_size": KERNEL_SIZES, "right_kernel_size": maybe(KERNEL_SIZES), "glu": FLAG,
    "weight_softmax": FLAG, "bias": FLAG, "output_normalization": FLAG, "heads": maybe(COUNT),
}
MIXER = {f"{where}.{key}": rule for where in ("mixer", "model.*.mixer", "model.*.legend.*")
         for key, rule in MIXER_OPTIONS.items()}
MODEL = {
    "model.name": TEXT, "model.embed_dim": COUNT, "model.*.embed_dim": COUNT, "model.*dropout": PROBABILITY,
    "model.*.layers": AnyOf((COUNT, ListOf(ListOf(COUNT), min_length=1))), "model.*.heads": COUNT, "model.*heads": maybe(COUNT),
    "model.*.ffn_dim": COUNT, "model.max_*_positions": COUNT, "model.positions": Choice(("sinusoidal", "learned")),
    "model.decoder_start": Choice(("bos", "eos")), "*kernel_backend": Choice(("auto", "triton", "torch")),
    "model.*.normalize_before": FLAG, "model.*.final_norm": FLAG, "model.share_*": FLAG, "model.scale_embedding": FLAG,
    "model.*.activation": Choice(tuple(ACTIVATIONS)), "model.*.pattern": TEXT, "model.*.out_embed_dim": COUNT,
    "model.decoder.attention": AnyOf((FLAG, ListOf(FLAG, min_length=1))),
    **MIXER,
}
GENERATION = {
    "beam_size": COUNT, "len_penalty": FINITE, "max_len_a": NONNEGATIVE, "max_len_b": COUNT0, "min_len_a": NONNEGATIVE,
    "min_len_b": COUNT0, "no_repeat_ngram_size": COUNT0, "no_repeat_ngram_unit": Choice(NGRAM_UNITS),
    "stepwise_len_penalty": FLAG,
    "length_beam": COUNT, "max_iterations": COUNT, "algorithm": maybe(Choice(("easy_first", "mask_predict"))),
}
DATA_SOURCE = {
    "path": TEXT, "pattern": TEXT, "name": TEXT, "config": maybe(TEXT), "cache_dir": maybe(TEXT),
    "load_from_disk": maybe(TEXT), "streaming": FLAG, "distilled_path": maybe(TEXT), "split_names.*": TEXT,
    "src_lang": TEXT,
    "tgt_lang": TEXT, "source_field": TEXT, "text_field": TEXT, "target_fields": AnyOf((TEXT, ListOf(TEXT, min_length=1))),
    "num_train": COUNT, "num_valid": COUNT, "num_test": COUNT, "min_len": COUNT, "max_len": COUNT, "vocab_size": COUNT,
    "seed": SEED, "remove_bpe": maybe(Text(r"\S+ ", "a BPE continuation marker and its space, e.g. '@@ '")),
}
TASK = {
    "task.name": TEXT, "task.src_lang": TEXT, "task.tgt_lang": TEXT, "task.distilled_data": maybe(TEXT),
    "task.download": maybe(Choice(tuple(CORPORA))),
    "task.vocab_size": COUNT, "task.data.max_tokens": COUNT, "task.data.max_tokens_valid": maybe(COUNT),
    "task.data.max_sentences": maybe(COUNT), "task.data.num_workers": COUNT0, "task.data.chunk_size": COUNT,
    "task.data.truncate_source": maybe(COUNT), "task.data.tokens_per_sample": COUNT, "task.data.eval_context": COUNT0,
    "task.data.max_skipped_fraction": Number(0, 1), "task.data.verify_store": FLAG,
    "task.data.max_positions": COUNT, "task.data.max_*_positions": COUNT, "task.data.seed": SEED,
    "task.data.break_mode": Choice(BREAK_MODES), "task.data.cache_dir": TEXT, "task.data.src_lang": TEXT,
    "task.data.tgt_lang": TEXT, "task.data.splits.*": maybe(TEXT), "task.data.splits.train": TEXT,
    "task.data.tokenizer.kind": Choice(TOKENIZER_KINDS), "task.data.tokenizer.vocab_size": COUNT,
    "task.data.tokenizer.min_frequency": COUNT, "task.data.tokenizer.lowercase": FLAG, "task.data.tokenizer.joint": FLAG,
    "task.data.tokenizer.file": maybe(TEXT),
    **{f"task.data.source.{k}": v for k, v in DATA_SOURCE.items()},
    **{f"task.generation.{k}": v for k, v in GENERATION.items()},
    **{f"task.nat.{k}": v for k, v in GENERATION.items()},
    **{f"task.eval_generation.{k}": v for k, v in GENERATION.items()},
    "task.module.eval_decode": FLAG, "task.monitor.metric": TEXT, "task.monitor.mode": MIN_MAX,
    "task.rouge.lead": COUNT, "task.rouge.stemming": FLAG, "task.bleu.lowercase": FLAG,
    "task.bleu.tokenize": Choice(tuple(BLEU.TOKENIZERS)), "task.bleu.paper": PAPER_BLEU,
    "task.bleu.pretokenized": FLAG, "task.bleu.lang": maybe(TEXT),
    "task.adaptive.factor": Number(1), "task.adaptive.softmax_dropout": PROBABILITY,
    "task.adaptive.cutoffs": ListOf(COUNT), "task.adaptive.input": FLAG, "task.adaptive.softmax": FLAG,
    "task.adaptive.project_all_bands": FLAG, "task.adaptive.tie_projections": FLAG,
}
CALLBACKS = {
    "callbacks.*.dirpath": TEXT, "callbacks.*.filename": TEXT, "callbacks.*.monitor": maybe(TEXT),
    "callbacks.*.mode": MIN_MAX, "callbacks.*.save_top_k": Number(-1, whole=True),
    "callbacks.*.auto_insert_metric_name": FLAG, "callbacks.*.save_on_train_epoch_end": maybe(FLAG),
    "callbacks.last_checkpoint.every_n_updates": COUNT0, "callbacks.interval_checkpoints.every_n_updates": COUNT0,
    "callbacks.interval_checkpoints.keep": KEEP_ALL_OR_N, "callbacks.lr_monitor.logging_interval": maybe(
        Choice(("step", "epoch"))), "callbacks.progress_bar.metrics_interval": maybe(COUNT),
    "callbacks.stop_min_lr.min_lr": NONNEGATIVE, "callbacks.dashboard.samples": COUNT0,
    "callbacks.dashboard.pictures": FLAG, "callbacks.dashboard.pictures_dir": TEXT, "callbacks.dashboard.max_heads": COUNT,
}
LOGGER = {
    "logger.csv.save_dir": TEXT, "logger.wandb.save_dir": maybe(TEXT), "logger.*.name": TEXT, "logger.wandb.project": TEXT, "logger.wandb.group": maybe(TEXT),
    "logger.wandb.offline": FLAG, "logger.wandb.log_model": AnyOf((FLAG, Choice(("all",)))),
    "logger.wandb.tags": ListOf(TEXT),
}
TRAINER = {
    "trainer.max_epochs": maybe(Number(-1, whole=True)), "trainer.max_steps": Number(-1, whole=True),
    "trainer.max_time": maybe(Text(r"\d+:\d\d:\d\d:\d\d", "a duration DD:HH:MM:SS")),
    "trainer.max_time.*": NONNEGATIVE,  # the dict form: {hours: 12}
    "trainer.accumulate_grad_batches": COUNT, "trainer.gradient_clip_val": maybe(NONNEGATIVE),
    "trainer.num_nodes": COUNT, "trainer.check_val_every_n_epoch": maybe(COUNT),
    "trainer.val_check_interval": maybe(AnyOf((COUNT, Number(0, 1, open_low=True)))),
    "trainer.limit_*_batches": maybe(AnyOf((COUNT0, Number(0, 1)))), "trainer.log_every_n_steps": COUNT,
    "trainer.overfit_batches": AnyOf((COUNT0, Number(0, 1))), "trainer.fast_dev_run": AnyOf((FLAG, COUNT0)),
    "trainer.num_sanity_val_steps": Number(-1, whole=True), "trainer.deterministic": AnyOf((FLAG, Choice(("warn",)))),
    "trainer.enable_progress_bar": FLAG, "trainer.use_distributed_sampler": FLAG, "trainer.default_root_dir": maybe(TEXT),
    # Lightning's precisions (its older spellings too) and accelerators; devices as Lightning counts them
    "trainer.precision": Choice(("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true",
                                 "transformer-engine", "transformer-engine-float16", 64, 32, 16, "64", "32", "16", "bf16")),
    "trainer.accelerator": Choice(("auto", "cpu", "gpu", "cuda", "mps", "tpu")),
    "trainer.devices": AnyOf((COUNT, Choice(("auto", -1)), ListOf(COUNT0, min_length=1))),
}
TRAIN = {
    "seed": SEED, "tags": ListOf(TEXT), "dry_run": FLAG, "run_test": FLAG,
    "slurm_requeue": FLAG, "fused_loss": FLAG, "resume": Choice(("auto", "never")), "label_smoothing": PROBABILITY,
    "compile": ON_OFF_AUTO, "compile_decoding": ON_OFF_AUTO, "nonfinite": Choice(("raise", "skip")),
    "nonfinite_skip_limit": COUNT, "stop_min_lr": NONNEGATIVE, "keep_last_epochs": COUNT0,
    "save_interval_updates": COUNT0, "keep_interval_updates": KEEP_ALL_OR_N,
    "ckpt_path": maybe(TEXT), "init_from": maybe(TEXT), "init_encoder_from": maybe(TEXT),
    "optim.lr": Number(0, open_low=True), "optim.weight_decay": NONNEGATIVE, "optim.eps": Number(0, open_low=True),
    "optim.betas": ListOf(Number(0, 1, open_high=True), length=2), "optim.momentum": Number(0, 1, open_high=True),
    "optim.nesterov": FLAG,
    "scheduler.warmup_updates": COUNT0, "scheduler.warmup_init_lr": NONNEGATIVE, "scheduler.*lr": NONNEGATIVE,
    "scheduler.total_updates": maybe(COUNT), "scheduler.factor": Number(0, 1, open_low=True, open_high=True),
    "scheduler.patience": COUNT0, "scheduler.threshold": NONNEGATIVE, "scheduler.monitor": TEXT,
    **TRAINER, **CALLBACKS, **LOGGER, **MODEL, **TASK,
}
PREPROCESS = {**TASK, "download": FLAG}  # preprocess.py reads the task (and download) of the train.yaml it composes
GENERATE = {
    **{k: maybe(v) for k, v in GENERATION.items()}, "average_last": COUNT0, "average_updates": FLAG, "max_tokens": COUNT,
    "max_sentences": maybe(COUNT), "eval_context": maybe(COUNT0), "compile_decoding": ON_OFF_AUTO,
    "split": TEXT, "device": TEXT, "output": TEXT, "input": maybe(TEXT),
    "ckpt_path": AnyOf((TEXT, ListOf(TEXT, min_length=1))), "score_reference": FLAG,
    "reference": maybe(TEXT), "distill_dir": maybe(TEXT), "paper_bleu": PAPER_BLEU,
    "metrics": maybe(ListOf(Choice(METRICS))), "quantize": maybe(Choice(QUANTIZE_CHOICES)),
    "nbest": COUNT, "sampling": FLAG, "top_k": maybe(COUNT0), "top_p": maybe(Number(0, 1, open_low=True)),
    "temperature": maybe(Number(0, open_low=True)), "seed": maybe(SEED), "prefix_size": COUNT0,
    "output_format": Choice(("text", "jsonl", "fairseq")),
    **{f"data.{k}": v for k, v in DATA_SOURCE.items()},  # another copy of the task's data (data.path=...)
}
# Keys no rule types, and why: each is checked where it is read (with its own seqmix error) or is Hydra's
READ_WHERE_USED = {
    "*._target_": "a class path: instantiate() names it when it does not import",
    "*._partial_": "Hydra's", "*._convert_": "Hydra's",
    "*.base_target": "a class path (distilled data wraps it)",
    "paths.*": "folders, checked when created or read",
    "trainer.strategy": "Lightning's strategy registry names the known ones",
    "trainer.profiler.*": "handed to Lightning's profiler",
}


def leaf_keys(node, prefix: str = "") -> Iterator[str]:
    """Every leaf key of a config node (lists are leaves); Hydra's own node is not ours to check."""
    if isinstance(node, dict):
        for key, value in node.items():
            if prefix or key != "hydra":
                yield from leaf_keys(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1]


def check(cfg: DictConfig, rules: dict[str, Rule]) -> None:
    """Refuse the first key of ``cfg`` whose value breaks a rule."""
    for key in leaf_keys(OmegaConf.to_container(cfg, resolve=False)):
        matching = [rule for pattern, rule in rules.items() if fnmatch.fnmatchcase(key, pattern)]
        if not matching:
            continue
        parent, _, name = key.rpartition(".")
        if OmegaConf.is_missing(OmegaConf.select(cfg, parent) if parent else cfg, name):
            continue  # ??? : reading it names the key (seqmix.config.user_errors)
        try:
            value = OmegaConf.select(cfg, key, throw_on_resolution_failure=True)
        except Exception:  # noqa: BLE001 - an interpolation only Hydra's runtime resolves: checked where it is read
            continue
        if isinstance(value, DictConfig) or OmegaConf.is_list(value):
            value = OmegaConf.to_container(value, resolve=True)
        for rule in matching:
            problem = rule.problem(value)
            if problem:
                raise SeqmixError(f"{key}={value!r}: {problem}")


def check_train_config(cfg: DictConfig) -> None:
    check(cfg, TRAIN)


def check_generate_config(cfg: DictConfig) -> None:
    check(cfg, GENERATE)


def untyped_keys(cfg: DictConfig, rules: dict[str, Rule]) -> list[str]:
    """Keys of ``cfg`` that no rule types and READ_WHERE_USED does not name: a new config key needs one or the other
    (tests check every shipped config)."""
    patterns = [*rules, *READ_WHERE_USED]
    return [key for key in leaf_keys(OmegaConf.to_container(cfg, resolve=False))
            if not any(fnmatch.fnmatchcase(key, p) for p in patterns)]
