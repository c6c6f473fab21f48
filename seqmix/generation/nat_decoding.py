"""Iterative parallel decoding of non-autoregressive models: length beam, mask-predict and parallel easy-first.

Every source gets ``length_beam`` candidates, one per predicted length (top-l lengths, at least 2 = one token +
eos); all candidates of the batch are refined together. A candidate row holds N real positions then eos; only
real positions are predicted. The final candidate of a source is the one with the highest mean log-probability
over its real tokens.

- mask-predict (Ghazvininejad et al. 2019): pass 1 predicts everything from nothing (eos only); refinement pass
  t = 1 .. T-1 re-masks the max(1, floor(N (T - t) / T)) least probable tokens and re-predicts them from the
  others (the rest keep their tokens and probabilities). Always T passes.
- parallel easy-first (Kasai et al. 2020, Alg. 1): pass 1 as above; its confidences fix an order; pass t >= 2
  re-predicts every position n from the previous tokens at the positions ranked more confident than n. A source
  stops at pass t when its best candidate (by mean log-prob at pass t) did not change from pass t-1; its
  iteration count is that t (T when it never converges). Finished sources leave the batch.

The model interface is ``NATModel``: ``encode``, ``predict(tokens, encoder_out, observed)``, ``banned_tokens``,
``eos`` / ``padding_idx`` / ``unk``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from seqmix.generation.options import NATOptions


@dataclass
class NATResult:
    tokens: list[Tensor]  # best candidate of each source, real tokens only (no eos)
    iterations: Tensor  # (B,) decoder passes spent on each source
    scores: Tensor  # (B,) mean log-probability of the chosen candidate
    history: list[tuple[Tensor, Tensor]] = field(default_factory=list)  # (tokens, logp) of all rows after each pass


def length_candidates(length_logits: Tensor, beam: int, min_length: int = 2, max_length: Tensor | None = None
                      ) -> Tensor:
    """(B, l) candidate lengths (eos included): the l most likely, clamped to at least ``min_length``; with
    ``max_length`` (B,), only lengths up to it compete (an untrained model's lengths would cost O(L^2) each)."""
    beam = min(beam, length_logits.size(-1) - 1)
    if max_length is not None:
        cap = max_length.clamp(min=min_length).unsqueeze(1)
        too_long = torch.arange(length_logits.size(-1), device=cap.device).unsqueeze(0) > cap
        top = length_logits.masked_fill(too_long, float("-inf")).topk(beam, dim=-1).indices
        return top.clamp(min=min_length).minimum(cap)
    return length_logits.topk(beam, dim=-1).indices.clamp(min=min_length)


def candidate_rows(lengths: Tensor, placeholder: int, eos: int, pad: int) -> Tensor:
    """(B * l, max length) rows: ``placeholder`` at the N = length - 1 real positions, then eos, then pads."""
    flat = lengths.reshape(-1)
    pos = torch.arange(int(flat.max()), device=flat.device).unsqueeze(0)
    rows = torch.full((flat.numel(), pos.size(1)), pad, dtype=torch.long, device=flat.device)
    rows = rows.masked_fill(pos < (flat - 1).unsqueeze(1), placeholder)
    return rows.masked_fill(pos == (flat - 1).unsqueeze(1), eos)


def mean_logprob(logp: Tensor, real: Tensor) -> Tensor:
    """Mean over the real positions, summed in float64: a float32 sum's rounding depends on the row's width, so a
    candidate's score (and the choice between candidates) would depend on the pads its batch gives it."""
    total = (logp.double() * real).sum(dim=-1) / real.sum(dim=-1).clamp(min=1)
    return total.to(logp.dtype)


def _predict(model, tokens: Tensor, encoder_out, observed: Tensor, banned: list[int],
             queries: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Most probable allowed token at every position (or at ``queries`` (B, Q)) and its log-probability (fp32).

    log p(best) = its logit - logsumexp over the whole vocabulary: the same numbers as a log-softmax, without
    writing one (the (rows, T, V) output dominates a decoder pass at batch size 1)."""
    extra = {} if queries is None else {"queries": queries}
    logits = model.predict(tokens, encoder_out, observed, **extra).float()
    normalizer = logits.logsumexp(dim=-1)
    logits[..., banned] = float("-inf")
    best, tok = max_and_argmax(logits)
    return tok, best - normalizer


def max_and_argmax(logits: Tensor, block: int = 64) -> tuple[Tensor, Tensor]:
    """``logits.max(dim=-1)`` (values, indices) over a vocabulary-sized last dim, faster on CPU, where a max
    that tracks indices does not vectorize: the maxima of ``block``-wide slices first (``amax``), then the index
    inside the winning slice; a tail shorter than ``block`` is compared on its own."""
    v = logits.size(-1)
    main = v - v % block
    if main == 0:
        return logits.max(dim=-1)
    blocks = logits[..., :main].unflatten(-1, (main // block, block))
    block_idx = blocks.amax(dim=-1).argmax(dim=-1)
    inner = blocks.gather(-2, block_idx[..., None, None].expand(*block_idx.shape, 1, block)).squeeze(-2)
    value, offset = inner.max(dim=-1)
    index = block_idx * block + offset
    if main < v:
        tail_value, tail_offset = logits[..., main:].max(dim=-1)
        better = tail_value > value
        value, index = torch.where(better, tail_value, value), torch.where(better, tail_offset + main, index)
    return value, index


def stale_queries(stale: Tensor) -> Tensor:
    """(B, Q) positions of the True entries of ``stale`` (B, T), each row's first; short rows repeat their first
    position (recomputing a position twice writes the same result twice). Every row needs one True entry."""
    order = (~stale).to(torch.uint8).argsort(dim=1, stable=True)
    count = stale.sum(dim=1, keepdim=True)
    queries = order[:, : int(count.max())]
    slot = torch.arange(queries.size(1), device=stale.device).unsqueeze(0)
    return torch.where(slot < count, queries, queries[:, :1])


class IterativeDecoder:
    """``generate(model, src_tokens)`` -> :class:`NATResult` with the algorithm, length beam and passes of
    ``options``; candidate lengths go up to ``max_len_a * source length + max_len_b`` (+ eos) when ``max_len_a``
    is set (the task's beam-search bounds)."""

    def __init__(self, options: NATOptions, min_length: int = 2, max_len_a: float | None = None,
                 max_len_b: int = 0) -> None:
        self.options = options
        self.min_length = min_length
        self.max_len_a, self.max_len_b = max_len_a, max_len_b

    @torch.no_grad()
    def generate(self, model, src_tokens: Tensor, trace: bool = False) -> NATResult:
        options = self.options.for_model(model)
        encoder_out, length_logits = model.encode(src_tokens)
        if hasattr(model, "with_cross_cache"):
            encoder_out = model.with_cross_cache(encoder_out)
        cap = None
        if self.max_len_a is not None:
            src_len = src_tokens.ne(model.padding_idx).sum(dim=1) - 1  # without the source eos
            cap = (self.max_len_a * src_len + self.max_len_b).floor().long() + 1
        lengths = length_candidates(length_logits, int(options.length_beam), self.min_length, cap)
        lengths = lengths.clamp(max=model.max_target_positions)
        run = easy_first if options.algorithm == "easy_first" else mask_predict
        return run(model, encoder_out, lengths, int(options.max_iterations), trace)


def _candidates(model, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """(candidate rows (B * l, T) of placeholders, their real positions) for the length beam ``lengths`` (B, l)."""
    tokens = candidate_rows(lengths, model.unk, model.eos, model.padding_idx)
    return tokens, tokens.ne(model.padding_idx) & tokens.ne(model.eos)


def _finish(tokens: Tensor, logp: Tensor, real: Tensor, best: Tensor, iterations: Tensor, k: int,
            history: list) -> NATResult:
    rows = torch.arange(best.numel(), device=best.device) * k + best
    chosen = [tokens[r][real[r]] for r in rows.tolist()]
    return NATResult(chosen, iterations, mean_logprob(logp, real)[rows], history)


def mask_predict(model, encoder_out, lengths: Tensor, max_iterations: int, trace: bool = False) -> NATResult:
    """Mask-predict over the length beam ``lengths`` (B, l); see the module docstring."""
    b, k = lengths.shape
    tokens, real = _candidates(model, lengths)
    enc = encoder_out.index_select(torch.arange(b, device=lengths.device).repeat_interleave(k))  # one per row
    banned = model.banned_tokens()
    tok, lp = _predict(model, tokens, enc, torch.zeros_like(real), banned)
    tokens = torch.where(real, tok, tokens)
    logp = lp.masked_fill(~real, 0.0)
    history = [(tokens.clone(), logp.clone())] if trace else []
    n = real.sum(dim=1, keepdim=True)
    for t in range(1, max_iterations):
        n_mask = ((n * (max_iterations - t)) // max_iterations).clamp(min=1)
        ascending = logp.masked_fill(~real, float("inf")).argsort(dim=-1, stable=True).argsort(dim=-1)
        masked = (ascending < n_mask) & real
        tok, lp = _predict(model, tokens, enc, real & ~masked, banned)
        tokens = torch.where(masked, tok, tokens)
        logp = torch.where(masked, lp, logp)
        if trace:
            history.append((tokens.clone(), logp.clone()))
    best = mean_logprob(logp, real).view(b, k).argmax(dim=1)
    iterations = torch.full((b,), max_iterations, dtype=torch.long, device=tokens.device)
    return _finish(tokens, logp, real, best, iterations, k, history)


def easy_first_contexts(logp: Tensor, real: Tensor) -> Tensor:
    """(rows, N, N) observed sets from first-pass confidences: query n sees m iff m ranks more confident."""
    order = logp.masked_fill(~real, float("-inf")).argsort(dim=-1, descending=True, stable=True)
    rank = order.argsort(dim=-1)
    return (rank.unsqueeze(1) < rank.unsqueeze(2)) & real.unsqueeze(1)


def _repredict(model, tokens: Tensor, logp: Tensor, encoder_out, sources: Tensor, k: int, observed: Tensor,
               banned: list[int], stale: Tensor) -> tuple[Tensor, Tensor]:
    """(tokens, logp) with the ``stale`` positions re-predicted and the others kept; sources without a stale
    position cost nothing, and neither do pads, eos or fresh positions (DisCo queries are independent).
    ``tokens``, ``logp``, ``observed`` and ``stale`` hold the k candidate rows of each of ``sources`` (rows of
    ``encoder_out``, indexed once, for the busy sources only); a source's candidates are predicted together, as
    one group of k * T slots (``DisCoTransformer.predict``)."""
    tokens, logp = tokens.clone(), logp.clone()
    s, t = sources.numel(), tokens.size(1)
    slots = stale.view(s, k * t)
    busy = slots.any(dim=1).nonzero().squeeze(1)
    if busy.numel():
        queries = stale_queries(slots[busy])
        tok, lp = _predict(model, tokens.view(s, k, t)[busy], encoder_out.index_select(sources[busy]),
                           observed.view(s, k, t, t)[busy], banned, queries)
        flat_tokens, flat_logp = tokens.view(s, k * t), logp.view(s, k * t)  # views: writes land in the rows
        flat_tokens[busy] = flat_tokens[busy].scatter(1, queries, tok)
        flat_logp[busy] = flat_logp[busy].scatter(1, queries, lp)
    return tokens, logp


def easy_first(model, encoder_out, lengths: Tensor, max_iterations: int, trace: bool = False) -> NATResult:
    """Parallel easy-first over the length beam ``lengths`` (B, l); see the module docstring.

    A pass recomputes only the stale positions, those whose observed set holds a token that the previous pass
    changed: the others would get exactly their previous prediction back."""
    b, k = lengths.shape
    tokens, real = _candidates(model, lengths)
    banned = model.banned_tokens()
    first_context = torch.zeros(real.shape + real.shape[-1:], dtype=torch.bool, device=real.device)
    every_source = torch.arange(b, device=real.device)
    tokens, logp = _repredict(model, tokens, torch.zeros(real.shape, device=real.device), encoder_out,
                              every_source, k, first_context, banned, real)
    changed = real.clone()  # every real position now holds a token instead of the placeholder
    history = [(tokens.clone(), logp.clone())] if trace else []
    contexts = easy_first_contexts(logp, real)
    best = mean_logprob(logp, real).view(b, k).argmax(dim=1)
    iterations = torch.full((b,), max_iterations, dtype=torch.long, device=tokens.device)
    done = torch.zeros(b, dtype=torch.bool, device=tokens.device)
    for t in range(2, max_iterations + 1):
        sources = (~done).nonzero().squeeze(1)
        if sources.numel() == 0:
            break
        rows = (sources.unsqueeze(1) * k + torch.arange(k, device=sources.device)).reshape(-1)
        before, r, seen = tokens[rows], real[rows], contexts[rows]
        stale = (seen & changed[rows].unsqueeze(1)).any(dim=-1) & r
        after, lp = _repredict(model, before, logp[rows], encoder_out, sources, k, seen, banned, stale)
        changed[rows] = after != before
        tokens[rows], logp[rows] = after, lp
        kstar = mean_logprob(lp, r).view(-1, k).argmax(dim=1)
        pick = torch.arange(sources.numel(), device=sources.device) * k + kstar
        converged = (after[pick] == before[pick]).all(dim=1)
        best[sources] = kstar
        iterations[sources[converged]] = t
        done[sources[converged]] = True
        if trace:
            history.append((tokens.clone(), logp.clone()))
    return _finish(tokens, logp, real, best, iterations, k, history)
