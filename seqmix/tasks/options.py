"""A task's settings from the run config, built in one place: each ``task.<key>`` node becomes its dataclass
(decoding: ``seqmix.generation.options``; scoring: below), so tasks never read raw config dicts."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TypeVar

from omegaconf import DictConfig, OmegaConf

from seqmix.errors import SeqmixError

T = TypeVar("T")


@dataclass(frozen=True)
class BleuOptions:
    """sacreBLEU's settings (``seqmix.metrics.corpus_bleu``)."""

    tokenize: str = "13a"
    lowercase: bool = False


@dataclass(frozen=True)
class RougeOptions:
    stemming: bool = True  # Porter stemming in rouge-score
    lead: int = 3  # sentences of the lead-N baseline


@dataclass(frozen=True)
class AdaptiveOptions:
    """Adaptive input/softmax of language models (``task.adaptive``; fields in sorted order for the error text)."""

    cutoffs: tuple[int, ...] = ()  # band boundaries in the frequency-sorted vocabulary
    factor: float = 4.0  # each band's width is the previous one's / factor
    input: bool = False
    softmax: bool = False
    softmax_dropout: float = 0.0


def from_config(cfg: DictConfig, key: str, cls: type[T]) -> T:
    """``cls`` from ``cfg.task.<key>`` (absent or null: its defaults); a key it does not know is a user error."""
    node = cfg.task.get(key)
    given = {} if node is None else OmegaConf.to_container(node, resolve=True)
    allowed = [f.name for f in fields(cls)]
    unknown = set(given) - set(allowed)
    if unknown:
        raise SeqmixError(f"unknown task.{key} keys {sorted(unknown)}; allowed: {allowed}")
    return cls(**given)
