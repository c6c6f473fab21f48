"""Several autoregressive models decoded as one: at every step the next-token distribution is the mean of the
members' distributions (in log space, ``logsumexp_i log p_i - log N``), the usual checkpoint ensemble of NMT.

:class:`Ensemble` offers what beam search and scoring call on a model (``encode``, ``for_beams``,
``init_decoder_state``, ``decode``), so neither knows it decodes an ensemble: each member keeps its own encoder output
and incremental state, selected and reordered together with the others'. Its ``decode`` returns log-probabilities,
which a log-softmax leaves unchanged, so callers that normalize logits get the mean distribution either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmix.errors import SeqmixError
from seqmix.generation.beam_search import beam_encoder_out


def log_probs(logits: Tensor) -> Tensor:
    """Log-softmax over the last dimension in at least float32 (float64 stays float64)."""
    return F.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def mean_distribution(member_log_probs: list[Tensor]) -> Tensor:
    """log of the mean of the members' probabilities, from their log-probabilities (same shape each)."""
    if len(member_log_probs) == 1:
        return member_log_probs[0]
    return torch.logsumexp(torch.stack(member_log_probs), dim=0) - math.log(len(member_log_probs))


@dataclass
class EnsembleEncoderOut:
    """One encoder output per member; they serve the same decoder rows (one ``group`` for all)."""

    members: list

    @property
    def group(self) -> int:
        return getattr(self.members[0], "group", 1)

    def index_select(self, index: Tensor) -> EnsembleEncoderOut:
        return EnsembleEncoderOut([m.index_select(index) for m in self.members])


@dataclass
class EnsembleState:
    """One incremental decoder state per member, reordered together."""

    members: list

    def reorder(self, index: Tensor) -> None:
        for state in self.members:
            state.reorder(index)


class Ensemble(nn.Module):
    """``models`` (autoregressive encoder-decoders over one target vocabulary) decoded as one model."""

    def __init__(self, models: list[nn.Module]) -> None:
        super().__init__()
        if not models:
            raise SeqmixError("an ensemble needs at least one model")
        starts = {getattr(m, "decoder_start", None) for m in models}
        if len(starts) > 1:
            raise SeqmixError(f"these models start their decoders with different symbols ({sorted(map(str, starts))}); "
                              "an ensemble feeds them one target prefix: ensemble models trained alike")
        self.models = nn.ModuleList(models)
        self.decoder_start = starts.pop()
        self.max_source_positions = min(getattr(m, "max_source_positions", 1024) for m in models)
        self.max_target_positions = min(getattr(m, "max_target_positions", 1024) for m in models)

    def encode(self, src_tokens: Tensor) -> EnsembleEncoderOut:
        return EnsembleEncoderOut([m.encode(src_tokens) for m in self.models])

    def for_beams(self, encoder_out: EnsembleEncoderOut, k: int) -> EnsembleEncoderOut:
        """Each member's output for ``k`` rows per source; when members disagree on sharing a source row between
        its rows (a model without ``for_beams`` copies it), every member gets copies, so that one selection index
        fits all."""
        members = [beam_encoder_out(m, out, k) for m, out in zip(self.models, encoder_out.members)]
        if len({getattr(out, "group", 1) for out in members}) > 1:
            members = [out.ungrouped() if getattr(out, "group", 1) > 1 else out for out in members]
        return EnsembleEncoderOut(members)

    def init_decoder_state(self, encoder_out: EnsembleEncoderOut) -> EnsembleState:
        return EnsembleState([m.init_decoder_state(out) for m, out in zip(self.models, encoder_out.members)])

    def decode(self, prev_output_tokens: Tensor, encoder_out: EnsembleEncoderOut,
               state: EnsembleState | None = None) -> Tensor:
        """Log-probabilities (B, T, V) of the mean distribution (``state``: incremental, as a member's decode)."""
        states = [None] * len(self.models) if state is None else state.members
        return mean_distribution([log_probs(m.decode(prev_output_tokens, out, s))
                                  for m, out, s in zip(self.models, encoder_out.members, states)])

    def forward(self, src_tokens: Tensor, prev_output_tokens: Tensor) -> Tensor:
        return self.decode(prev_output_tokens, self.encode(src_tokens))
