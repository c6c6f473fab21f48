"""Types, ranges and allowed values of the config keys, checked right after composition, before anything is built or
written: a wrong value is one ``SeqmixError`` naming the key, the value and what is allowed, instead of an error deep
inside Lightning, the optimizer or a model (or, worse, a run that trains on nonsense).

Rules are glob patterns over dotted keys (``model.*.layers`` matches ``model.encoder.layers``; ``*`` also crosses
dots); a key may match several rules and must satisfy each. Keys no rule names are left to the code that reads them.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterator
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from seqmix.errors import SeqmixError


class Rule:
    def problem(self, value) -> str | None:
        """None when ``value`` is allowed, else what is allowed."""
        raise NotImplementedError


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

    def problem(self, value) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float) or (self.whole and not isinstance(value, int)):
            return f"must be {self.describe()}"
        if not math.isfinite(value):
            return f"must be {self.describe()}"
        below = value <= self.low if self.open_low else value < self.low
        above = value >= self.high if self.open_high else value > self.high
        return f"must be {self.describe()}" if below or above else None


@dataclass(frozen=True)
class Choice(Rule):
    values: tuple

    def problem(self, value) -> str | None:
        if isinstance(value, bool) and not any(isinstance(v, bool) for v in self.values):
            return f"must be one of {list(self.values)}"
        return None if value in self.values else f"must be one of {list(self.values)}"


@dataclass(frozen=True)
class Kind(Rule):
    """A value of one Python type (``bool`` or ``str``), a non-empty string when ``str``."""

    type_: type

    def problem(self, value) -> str | None:
        names = {bool: "true or false", str: "a non-empty string"}
        if not isinstance(value, self.type_) or (self.type_ is str and not value.strip()):
            return f"must be {names.get(self.type_, self.type_.__name__)}"
        return None


@dataclass(frozen=True)
class ListOf(Rule):
    item: Rule
    length: int | None = None
    min_length: int = 0

    def problem(self, value) -> str | None:
        allowed = (self.item.problem(object()) or "").removeprefix("must be ")
        size = f"{self.length} " if self.length is not None else ("non-empty " if self.min_length else "")
        if not isinstance(value, list | tuple) or (self.length is not None and len(value) != self.length) \
                or len(value) < self.min_length:
            return f"must be a list of {size}items, each {allowed}"
        return f"must be a list of {size}items, each {allowed}" if any(self.item.problem(v) for v in value) else None


@dataclass(frozen=True)
class AnyOf(Rule):
    rules: tuple[Rule, ...]

    def problem(self, value) -> str | None:
        problems = [r.problem(value) for r in self.rules]
        if all(problems):
            return "must be " + " or ".join(p.removeprefix("must be ") for p in problems)
        return None


def maybe(rule: Rule) -> Rule:
    """``rule``, or null."""
    return AnyOf((rule, Choice((None,))))


COUNT = Number(1, whole=True)
COUNT0 = Number(0, whole=True)
PROBABILITY = Number(0, 1, open_high=True)
FLAG = Kind(bool)
FINITE = Number()
NONNEGATIVE = Number(0)
ON_OFF_AUTO = AnyOf((FLAG, Choice(("auto",))))

MODEL = {
    "model.embed_dim": COUNT, "model.*.embed_dim": COUNT, "model.*dropout": PROBABILITY,
    "model.*.layers": AnyOf((COUNT, ListOf(ListOf(COUNT), min_length=1))), "model.*.heads": COUNT, "model.*heads": maybe(COUNT),
    "model.*.ffn_dim": COUNT, "model.max_*_positions": COUNT, "model.positions": Choice(("sinusoidal", "learned")),
    "model.decoder_start": Choice(("bos", "eos")), "*kernel_backend": Choice(("auto", "triton", "torch")),
    "model.*.mixer.kernel_size": AnyOf((COUNT, ListOf(COUNT))), "model.*.normalize_before": FLAG,
    "model.*.mixer.glu": FLAG, "model.*.mixer.weight_softmax": FLAG, "model.*.mixer.bias": FLAG,
    "model.*.mixer.output_normalization": FLAG,
    "model.share_*": FLAG, "model.scale_embedding": FLAG,
}
GENERATION = {
    "beam_size": COUNT, "len_penalty": FINITE, "max_len_a": NONNEGATIVE, "max_len_b": COUNT0, "min_len_a": NONNEGATIVE,
    "min_len_b": COUNT0, "no_repeat_ngram_size": COUNT0, "stepwise_len_penalty": FLAG,
    "length_beam": COUNT, "max_iterations": COUNT, "algorithm": maybe(Choice(("easy_first", "mask_predict"))),
}
TASK = {
    "task.vocab_size": COUNT, "task.data.max_tokens": COUNT, "task.data.max_tokens_valid": maybe(COUNT),
    "task.data.max_sentences": maybe(COUNT), "task.data.num_workers": COUNT0, "task.data.chunk_size": COUNT,
    "task.data.truncate_source": maybe(COUNT), "task.data.tokens_per_sample": COUNT, "task.data.eval_context": COUNT0,
    "task.data.max_skipped_fraction": Number(0, 1), "task.data.verify_store": FLAG,
    **{f"task.generation.{k}": v for k, v in GENERATION.items()},
    **{f"task.nat.{k}": v for k, v in GENERATION.items()},
    "task.rouge.lead": COUNT, "task.rouge.stemming": FLAG, "task.bleu.lowercase": FLAG,
    "task.adaptive.factor": Number(1), "task.adaptive.softmax_dropout": PROBABILITY,
    "task.adaptive.cutoffs": ListOf(COUNT), "task.adaptive.input": FLAG, "task.adaptive.softmax": FLAG,
}
TRAIN = {
    "seed": Number(0, 2**32 - 1, whole=True), "tags": ListOf(Kind(str)), "dry_run": FLAG, "run_test": FLAG,
    "slurm_requeue": FLAG, "fused_loss": FLAG, "resume": Choice(("auto", "never")), "label_smoothing": PROBABILITY,
    "compile": ON_OFF_AUTO, "compile_decoding": ON_OFF_AUTO, "nonfinite": Choice(("raise", "skip")),
    "nonfinite_skip_limit": COUNT, "stop_min_lr": NONNEGATIVE, "keep_last_epochs": COUNT0,
    "ckpt_path": maybe(Kind(str)), "init_from": maybe(Kind(str)),
    "optim.lr": Number(0, open_low=True), "optim.weight_decay": NONNEGATIVE, "optim.eps": Number(0, open_low=True),
    "optim.betas": ListOf(Number(0, 1, open_high=True), length=2), "optim.momentum": Number(0, 1, open_high=True),
    "scheduler.warmup_updates": COUNT0, "scheduler.warmup_init_lr": NONNEGATIVE, "scheduler.*lr": NONNEGATIVE,
    "trainer.max_epochs": maybe(Number(-1, whole=True)), "trainer.max_steps": Number(-1, whole=True),
    "trainer.accumulate_grad_batches": COUNT, "trainer.gradient_clip_val": maybe(NONNEGATIVE),
    "trainer.num_nodes": COUNT, "trainer.check_val_every_n_epoch": maybe(COUNT),
    "trainer.val_check_interval": maybe(AnyOf((COUNT, Number(0, 1, open_low=True)))),
    "trainer.limit_*_batches": maybe(AnyOf((COUNT0, Number(0, 1)))), "trainer.log_every_n_steps": COUNT,
    "trainer.num_sanity_val_steps": Number(-1, whole=True), "trainer.deterministic": AnyOf((FLAG, Choice(("warn",)))),
    # Lightning's precisions (its older spellings too) and accelerators; devices as Lightning counts them
    "trainer.precision": Choice(("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true",
                                 "transformer-engine", "transformer-engine-float16", 64, 32, 16, "64", "32", "16", "bf16")),
    "trainer.accelerator": Choice(("auto", "cpu", "gpu", "cuda", "mps", "tpu")),
    "trainer.devices": AnyOf((COUNT, Choice(("auto", -1)), ListOf(COUNT0, min_length=1))),
    **MODEL, **TASK,
}
GENERATE = {
    **{k: maybe(v) for k, v in GENERATION.items()}, "average_last": COUNT0, "max_tokens": COUNT,
    "max_sentences": maybe(COUNT), "eval_context": maybe(COUNT0), "compile_decoding": ON_OFF_AUTO,
    "split": Kind(str), "device": Kind(str), "output": Kind(str),
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
