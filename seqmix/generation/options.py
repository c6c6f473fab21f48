"""Decoding settings, defined once per algorithm: the run config's ``task.generation`` (beam search) and
``task.nat`` (iterative NAT decoding) become these dataclasses, ``generate.py``'s command-line overrides are
their field names, and the decoders read them."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TypeVar

from seqmix.errors import SeqmixError

ALGORITHMS = ("easy_first", "mask_predict")
NGRAM_UNITS = ("token", "word")


@dataclass(frozen=True)
class BeamOptions:
    """Beam search (fairseq conventions, see ``seqmix.generation.beam_search``)."""

    beam_size: int = 5
    len_penalty: float = 1.0
    max_len_a: float = 0.0  # max length = max_len_a * source length + max_len_b
    max_len_b: int = 200
    min_len_a: float = 0.0
    min_len_b: int = 1
    no_repeat_ngram_size: int = 0
    no_repeat_ngram_unit: str = "token"  # token (fairseq) | word: n-grams of whole words (generation.word_ngrams)
    stepwise_len_penalty: bool = False

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise SeqmixError("beam_size must be >= 1")
        if self.no_repeat_ngram_unit not in NGRAM_UNITS:
            raise SeqmixError(f"no_repeat_ngram_unit={self.no_repeat_ngram_unit!r} is unknown; choose one of "
                              f"{list(NGRAM_UNITS)}")


@dataclass(frozen=True)
class NATOptions:
    """Iterative parallel decoding (see ``seqmix.generation.nat_decoding``); ``algorithm=None`` picks the
    model's natural one (:meth:`for_model`)."""

    algorithm: str | None = None
    length_beam: int = 5
    max_iterations: int = 10

    def __post_init__(self) -> None:
        if self.algorithm is not None and self.algorithm not in ALGORITHMS:
            raise SeqmixError(f"algorithm={self.algorithm!r} is unknown; choose one of {list(ALGORITHMS)}")
        if int(self.length_beam) < 1 or int(self.max_iterations) < 1:
            raise SeqmixError(f"length_beam={self.length_beam} and max_iterations={self.max_iterations} "
                              "must be >= 1")

    def for_model(self, model) -> NATOptions:
        """The settings ``model`` decodes with: parallel easy-first needs per-query contexts (DisCo), so it is the
        default there and an error elsewhere; mask-predict works with any NAT model."""
        per_query = bool(getattr(model, "per_query_contexts", False))
        if self.algorithm is None:
            return replace(self, algorithm="easy_first" if per_query else "mask_predict")
        if self.algorithm == "easy_first" and not per_query:
            raise SeqmixError("parallel easy-first needs per-query contexts (model=disco); decode this "
                              f"{type(model).__name__} with algorithm=mask_predict")
        return self


@dataclass(frozen=True)
class SamplingOptions:
    """Ancestral sampling (``seqmix.generation.sampling``): each step draws from the model's next-token distribution
    at ``temperature``, cut to the ``top_k`` most likely tokens (0: all) and then to the smallest set whose
    probability reaches ``top_p``; ``seed`` makes the draws repeatable (None: torch's global generator)."""

    top_k: int = 0
    top_p: float = 1.0
    temperature: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.top_k, bool) or int(self.top_k) != self.top_k or self.top_k < 0:
            raise SeqmixError(f"top_k={self.top_k!r} must be a whole number >= 0 (0: no cut)")
        if not 0 < float(self.top_p) <= 1:
            raise SeqmixError(f"top_p={self.top_p!r} must be in (0, 1]")
        if not float(self.temperature) > 0 or float(self.temperature) == float("inf"):
            raise SeqmixError(f"temperature={self.temperature!r} must be a finite number > 0")


@dataclass(frozen=True)
class DecodeRequest:
    """What to return beyond the best hypothesis: ``nbest`` hypotheses per input (beam search: the best of the
    beam, in rank order; sampling: independent samples), ``sampling`` instead of beam search, and the first
    ``prefix_size`` tokens of each reference forced (fairseq's --prefix-size)."""

    nbest: int = 1
    sampling: SamplingOptions | None = None
    prefix_size: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.nbest, bool) or int(self.nbest) != self.nbest or self.nbest < 1:
            raise SeqmixError(f"nbest={self.nbest!r} must be a whole number >= 1")
        if isinstance(self.prefix_size, bool) or int(self.prefix_size) != self.prefix_size or self.prefix_size < 0:
            raise SeqmixError(f"prefix_size={self.prefix_size!r} must be a whole number >= 0")

    @property
    def plain(self) -> bool:
        """Only the best hypothesis of plain beam search: what every decoder offers."""
        return self == DecodeRequest()


# every name generate.py may pass to a translation task (the union over the decoding algorithms)
DECODING_OPTIONS = tuple(dict.fromkeys(f.name for cls in (BeamOptions, NATOptions) for f in fields(cls)))

Options = TypeVar("Options", BeamOptions, NATOptions)


def option_names(options) -> list[str]:
    return [f.name for f in fields(options)]


def settings_text(options) -> str:
    """``name=value`` for every field: what a decoder runs with, as a user would pass it to generate.py."""
    return " ".join(f"{name}={getattr(options, name)}" for name in option_names(options))


def overridden(options: Options, overrides: dict, applies_to: str) -> Options:
    """``options`` with the non-None ``overrides`` replacing fields; a name that is no field is a user error."""
    given = {k: v for k, v in overrides.items() if v is not None}
    unknown = set(given) - set(option_names(options))
    if unknown:
        raise SeqmixError(f"{sorted(unknown)} do not apply to {applies_to}; its options are "
                          f"{option_names(options)}")
    return replace(options, **given)
