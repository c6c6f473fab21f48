"""Ancestral sampling on beam search's loop: ``k`` rows per sentence are ``k`` independent samples, each extended
by a token drawn from its own next-token distribution instead of the beam's best ``2k`` extensions.

Only how rows extend differs from :class:`~seqmix.generation.beam_search.BeamSearch`: the step (incremental decoder
call, length bounds, banned tokens, forced prefixes) is its ``_next_lprobs``, finished samples are finalized by its
code. Every row starts live, keeps its place (row ``j`` is sample ``j``) and ends at its own eos.

Scores are the model's: a sample's positional scores are the log-probabilities of its tokens under the model's
distribution (temperature 1, nothing cut), and its score ``sum / length ** len_penalty``, as a beam hypothesis's, so
teacher-forced scoring (``seqmix.generation.scoring``) of a sample gives its score back. ``temperature``, ``top_k``
and ``top_p`` only shape the distribution drawn from (:func:`sampling_log_probs`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch import Tensor

from seqmix.generation.beam_search import BeamSearch, _Beams
from seqmix.generation.options import BeamOptions, SamplingOptions


def sampling_log_probs(lprobs: Tensor, options: SamplingOptions) -> Tensor:
    """(R, V) log-probabilities of the distribution a sample draws from: ``lprobs / temperature`` renormalized, cut
    to the ``top_k`` most likely tokens, then to the most likely tokens whose probability before each is below
    ``top_p`` (the first always stays), renormalized; cut tokens are -inf."""
    logits = lprobs / options.temperature
    if options.top_k > 0:
        keep = torch.zeros_like(logits, dtype=torch.bool)
        keep.scatter_(1, logits.topk(min(options.top_k, logits.size(1)), dim=1).indices, True)
        logits = logits.masked_fill(~keep, -math.inf)
    logits = torch.log_softmax(logits, dim=1)
    if options.top_p < 1:
        probs, order = logits.exp().sort(dim=1, descending=True)
        before = probs.cumsum(1) - probs
        drop = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, order, before >= options.top_p)
        logits = torch.log_softmax(logits.masked_fill(drop, -math.inf), dim=1)
    return logits


class Sampler(BeamSearch):
    """``nbest`` independent samples per source with ``sampling`` options (``options``: the length bounds and bans
    of beam search; its beam_size and stepwise_len_penalty do not apply)."""

    def __init__(self, bos: int, eos: int, pad: int, options: BeamOptions | None = None,
                 sampling: SamplingOptions | None = None, nbest: int = 1, **kwargs) -> None:
        super().__init__(bos, eos, pad, replace(options or BeamOptions(), beam_size=nbest, stepwise_len_penalty=False),
                         **kwargs)
        self.sampling = sampling or SamplingOptions()
        self.generator: torch.Generator | None = None

    def generate(self, model, src_tokens: Tensor, prefix: Tensor | None = None, context: bool = False):
        """As beam search's; with a seed, the draws of one call depend only on it and on the batch."""
        if self.sampling.seed is not None:
            self.generator = torch.Generator(device=src_tokens.device).manual_seed(int(self.sampling.seed))
        return super().generate(model, src_tokens, prefix, context)

    def _start(self, src_tokens: Tensor, prefix: Tensor | None = None, context: bool = False) -> _Beams:
        beams = super()._start(src_tokens, prefix, context)
        beams.cum.zero_()  # every sample is live from the start
        return beams

    def _candidates(self, beams: _Beams, lprobs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One drawn token per row, its row as parent, its cumulative model score: (B, k) each."""
        bsz, k = beams.cum.shape
        draw = sampling_log_probs(lprobs, self.sampling)
        stuck = ~torch.isfinite(draw).any(1)  # every token banned (no_repeat_ngram_size): the row can only end
        if stuck.any():
            draw[stuck] = -math.inf
            draw[stuck, self.eos] = 0.0
            lprobs[stuck, self.eos] = lprobs[stuck, self.eos].clamp(min=-1e4)
        tokens = torch.multinomial(draw.exp(), 1, generator=self.generator).squeeze(1)
        scores = beams.cum.view(-1) + lprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
        rows = torch.arange(bsz * k, device=lprobs.device)
        return scores.view(bsz, k), tokens.view(bsz, k), rows.view(bsz, k)

    def _keep_live(self, beams: _Beams, top_scores: Tensor, top_tok: Tensor, top_rows: Tensor, step: int) -> Tensor:
        """Each row takes its own token; a row that ended stays dead (-inf) until its sentence is done."""
        live = beams.cum.view(-1) > -math.inf
        beams.tokens[:, step + 1] = top_tok.flatten()
        beams.pos_scores[:, step] = torch.where(live, top_scores.flatten() - beams.cum.view(-1), 0.0)
        beams.cum = top_scores.masked_fill(top_tok.eq(self.eos), -math.inf)
        beams.cum[beams.done] = -math.inf
        return top_rows.flatten()
