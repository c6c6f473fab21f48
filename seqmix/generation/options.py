"""Decoding settings, defined once per algorithm: the run config's ``task.generation`` (beam search) and
``task.nat`` (iterative NAT decoding) become these dataclasses, ``generate.py``'s command-line overrides are
their field names, and the decoders read them."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TypeVar

from seqmix.errors import SeqmixError

ALGORITHMS = ("easy_first", "mask_predict")


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
    stepwise_len_penalty: bool = False

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise SeqmixError("beam_size must be >= 1")


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
