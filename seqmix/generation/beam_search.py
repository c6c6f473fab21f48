"""Batched beam search over any model with ``encode`` / ``init_decoder_state`` / ``decode``.

fairseq conventions: hypotheses end in eos; a finished hypothesis scores
``sum(log p) / len ** len_penalty`` with len counting the eos; a sentence is done once ``beam_size``
hypotheses are finished; eos is only taken from the best ``beam_size`` candidates. Lengths are per
sentence: ``max_len = max_len_a * src_len + max_len_b`` (src_len counts the source's eos, not pads).

``stepwise_len_penalty`` (summarization, Wu et al. 2019 §5.2) applies the length-normalized score at every step
instead of only when ranking the first ``beam_size`` finished hypotheses: a sentence stops only once no live
hypothesis can still beat its worst finished one under that score, and a better late hypothesis replaces a
worse early one. Plain fairseq stopping keeps the first finished (short) hypotheses even when
``len_penalty > 1`` would prefer longer ones. It never lowers the best score (live beams are the same).

A ``prefix`` (rows of token ids, right-padded) forces each sentence's first tokens. As output (fairseq's
--prefix-size) they are part of the hypothesis, scored with the model's log-probabilities and counted in its length;
as ``context`` (a language model's prompt) they are only read: the hypothesis, its score and its length bounds are
the continuation's. The search's steps (:meth:`BeamSearch._next_lprobs`, ``_candidates``, ``_keep_live``) are
separate so that sampling (``seqmix.generation.sampling``) reuses the loop and changes only how rows extend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from seqmix.errors import SeqmixError
from seqmix.generation.options import BeamOptions
from seqmix.generation.word_ngrams import WordBoundaries, ban_repeated_word_ngrams


@dataclass
class Hypothesis:
    tokens: Tensor  # generated tokens, ending in eos, without bos
    score: float  # length-normalized total log-probability
    positional_scores: Tensor  # log-probability of each token


def ban_repeated_ngrams(lprobs: Tensor, generated: Tensor, n: int) -> None:
    """Set -inf for every token that would complete an n-gram already present in ``generated`` (rows)."""
    length = generated.size(1)
    if n <= 0 or length < n:
        return
    grams = generated.unfold(1, n, 1)  # (R, L-n+1, n)
    prefix = generated[:, length - n + 1:] if n > 1 else generated[:, :0]
    match = (grams[:, :, : n - 1] == prefix.unsqueeze(1)).all(-1)  # (R, L-n+1)
    rows, where = match.nonzero(as_tuple=True)
    lprobs[rows, grams[rows, where, -1]] = -math.inf


def beam_encoder_out(model, encoder_out, k: int):
    """The encoder output for ``k`` consecutive decoder rows per source: shared by the rows when the model can
    (``model.for_beams``), else ``k`` copies of each source row."""
    if hasattr(model, "for_beams"):
        return model.for_beams(encoder_out, k)
    rows = torch.arange(encoder_out.out.size(0), device=encoder_out.out.device).repeat_interleave(k)
    return encoder_out.index_select(rows)


@dataclass
class _Beams:
    """A batch's search state: ``k`` live rows per sentence (row ``b * k + j``) and its finished hypotheses."""

    tokens: Tensor  # (B * k, steps + 2): the start symbol, the tokens generated so far, pads
    pos_scores: Tensor  # (B * k, steps + 1): log-probability of each generated token
    cum: Tensor  # (B, k): cumulative log-probability of each live row
    done: Tensor  # (B,): the sentence has stopped
    rows_min: Tensor  # (B * k,): each row's minimum and maximum length
    rows_max: Tensor
    max_len: Tensor  # (B,)
    finalized: list[list[Hypothesis]]  # of each live sentence (finished sentences leave the batch)
    prefix: Tensor | None = None  # (B * k, P): forced first tokens, pad past each row's prefix_len
    prefix_len: Tensor | None = None  # (B * k,)
    context: Tensor | None = None  # (B,): leading tokens that are context, not output (0 without)


class BeamSearch:
    """Beam search with ``options`` (:class:`BeamOptions`; keyword ``settings`` replace its fields).

    ``start``: the decoder's first input, the symbol the model was trained with behind the target (``bos`` when
    None; fairseq's models use eos). bos is never an output either way."""

    def __init__(self, bos: int, eos: int, pad: int, options: BeamOptions | None = None, incremental: bool = True,
                 max_target_positions: int | None = None, start: int | None = None,
                 words: WordBoundaries | None = None, **settings) -> None:
        self.bos, self.eos, self.pad = bos, eos, pad
        self.start = bos if start is None else start
        self.options = replace(options or BeamOptions(), **settings)
        if self.options.no_repeat_ngram_size > 0 and self.options.no_repeat_ngram_unit == "word" and words is None:
            raise SeqmixError("no_repeat_ngram_unit=word needs to know where words begin and end, and this decoder "
                              "was given no tokenizer's word marks; use no_repeat_ngram_unit=token")
        self.words = words
        self.incremental = incremental
        self.max_target_positions = max_target_positions

    def length_bounds(self, src_tokens: Tensor, prefix_len: Tensor | None = None,
                      context: bool = False) -> tuple[Tensor, Tensor]:
        """(min, max) tokens per sentence, eos not counted, from the start: a context prefix adds its length to
        both; an output prefix raises the maximum to leave one free step after it."""
        o = self.options
        src_len = src_tokens.ne(self.pad).sum(1).float()
        max_len = (o.max_len_a * src_len + o.max_len_b).long()
        min_len = (o.min_len_a * src_len + o.min_len_b).long().clamp(min=0)
        if prefix_len is not None:
            if context:
                max_len, min_len = max_len + prefix_len, min_len + prefix_len
            else:
                max_len = max_len.maximum(prefix_len + 1)
        if self.max_target_positions is not None:
            if prefix_len is not None and bool((prefix_len + 1 > self.max_target_positions - 1).any()):
                raise SeqmixError(f"a forced prefix of {int(prefix_len.max())} tokens leaves no room in the model's "
                                  f"{self.max_target_positions} target positions; shorten it")
            max_len = max_len.clamp(max=self.max_target_positions - 1)
        max_len = max_len.clamp(min=1)
        return min_len.minimum(max_len), max_len

    @torch.no_grad()
    def generate(self, model, src_tokens: Tensor, prefix: Tensor | None = None,
                 context: bool = False) -> list[list[Hypothesis]]:
        """Best-first hypotheses for each source row; ``prefix`` (B, P) forces each row's first tokens (pad after
        its end), as ``context`` or as output (see the module's docstring)."""
        k = self.options.beam_size
        beams = self._start(src_tokens, prefix, context)
        steps = int(beams.max_len.max())
        encoder_out = beam_encoder_out(model, model.encode(src_tokens), k)
        state = model.init_decoder_state(encoder_out) if self.incremental else None
        results = beams.finalized
        for step in range(steps + 1):
            lprobs = self._next_lprobs(model, beams, encoder_out, state, step)
            top_scores, top_tok, top_rows = self._candidates(beams, lprobs)
            self._end_hypotheses(beams, top_scores, top_tok, top_rows, step)
            if bool(beams.done.all()) or step == steps:
                break
            rows = self._keep_live(beams, top_scores, top_tok, top_rows, step)
            if bool(beams.done.all()):
                break
            kept = self._drop_finished(beams)
            if kept is not None:
                rows = rows[kept[1]]
                encoder_out = encoder_out.index_select(kept[1] if getattr(encoder_out, "group", 1) == 1 else kept[0])
            if state is not None and (k > 1 or kept is not None):  # one row per sentence: rows is the identity
                state.reorder(rows)
        return [sorted(f, key=lambda h: -h.score)[:k] for f in results]

    def _drop_finished(self, beams: _Beams) -> tuple[Tensor, Tensor] | None:
        """Take the sentences that stopped out of the search, so that their rows cost no more decoder steps.
        Returns the kept sentences and rows (old numbering), or None when every sentence is live."""
        if not bool(beams.done.any()):
            return None
        keep = (~beams.done).nonzero().flatten()
        k = self.options.beam_size
        rows = (keep.unsqueeze(1) * k + torch.arange(k, device=keep.device)).flatten()
        beams.tokens, beams.pos_scores = beams.tokens[rows], beams.pos_scores[rows]
        beams.rows_min, beams.rows_max = beams.rows_min[rows], beams.rows_max[rows]
        beams.cum, beams.done, beams.max_len = beams.cum[keep], beams.done[keep], beams.max_len[keep]
        if beams.prefix is not None:
            beams.prefix, beams.prefix_len, beams.context = beams.prefix[rows], beams.prefix_len[rows], beams.context[keep]
        beams.finalized = [beams.finalized[i] for i in keep.tolist()]  # the same lists: results fill in place
        return keep, rows

    def _start(self, src_tokens: Tensor, prefix: Tensor | None = None, context: bool = False) -> _Beams:
        """Every row holds the start symbol; at step 0 the k rows of a sentence are the same prefix, so only one is
        live."""
        bsz, k = src_tokens.size(0), self.options.beam_size
        device = src_tokens.device
        prefix_len = None
        if prefix is not None:
            prefix = prefix.to(device)
            prefix_len = prefix.ne(self.pad).sum(1)
        min_len, max_len = self.length_bounds(src_tokens, prefix_len, context)
        steps = int(max_len.max())
        tokens = torch.full((bsz * k, steps + 2), self.pad, dtype=torch.long, device=device)
        tokens[:, 0] = self.start
        cum = torch.zeros(bsz, k, device=device)
        cum[:, 1:] = -math.inf
        beams = _Beams(tokens, torch.zeros(bsz * k, steps + 1, device=device), cum,
                       torch.zeros(bsz, dtype=torch.bool, device=device), min_len.repeat_interleave(k),
                       max_len.repeat_interleave(k), max_len, [[] for _ in range(bsz)])
        if prefix is not None:
            beams.prefix, beams.prefix_len = prefix.repeat_interleave(k, 0), prefix_len.repeat_interleave(k)
            beams.context = prefix_len if context else torch.zeros_like(prefix_len)
        return beams

    def _next_lprobs(self, model, beams: _Beams, encoder_out, state, step: int) -> Tensor:
        """(B * k, V) log-probabilities of each row's next token, with the moves it may not make at -inf."""
        if state is not None:
            logits = model.decode(beams.tokens[:, step: step + 1], encoder_out, state)[:, -1]
        else:
            logits = model.decode(beams.tokens[:, : step + 1], encoder_out)[:, -1]
        lprobs = F.log_softmax(logits.float(), dim=-1)
        forced = None
        if beams.prefix is not None and step < beams.prefix.size(1):
            rows = (beams.prefix_len > step).nonzero().flatten()
            if rows.numel():
                tok = beams.prefix[rows, step]
                context = beams.context[rows // beams.cum.size(1)] > 0
                forced = rows, tok, lprobs[rows, tok].masked_fill(context, 0.0)
        lprobs[:, self.pad] = -math.inf
        lprobs[:, self.bos] = -math.inf
        lprobs[beams.rows_min > step, self.eos] = -math.inf
        at_max = beams.rows_max <= step
        if at_max.any():  # the only move left is to end the hypothesis
            eos_col = lprobs[at_max, self.eos].clone()
            lprobs[at_max] = -math.inf
            lprobs[at_max, self.eos] = eos_col
        n = self.options.no_repeat_ngram_size
        if n > 0 and self.options.no_repeat_ngram_unit == "word":
            ban_repeated_word_ngrams(lprobs, beams.tokens[:, 1: step + 1], n, self.words, self.eos, keep_eos=at_max)
        elif n > 0:
            ban_repeated_ngrams(lprobs, beams.tokens[:, 1: step + 1], n)
        if forced is not None:  # the prefix's token is the only move, with its own log-probability (context: 0)
            rows, tok, scores = forced
            lprobs[rows] = -math.inf
            lprobs[rows, tok] = scores
        return lprobs

    def _candidates(self, beams: _Beams, lprobs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The best 2k extensions of each sentence: (B, 2k) cumulative scores, tokens and parent rows."""
        bsz, k = beams.cum.shape
        if k == 1 and not self.options.stepwise_len_penalty:
            # greedy: a sentence whose best token is eos ends, so the runner-up the 2k candidates hold for beams
            # would never be used; the best token alone, cum added after the (B, V) reduction, not before
            top_scores, top_tok = lprobs.max(1, keepdim=True)
            return top_scores + beams.cum, top_tok, torch.arange(bsz, device=lprobs.device).unsqueeze(1)
        # a sentence's best 2k extensions are among its rows' own best 2k tokens (a row's cum shifts all its tokens
        # alike): cum is added to (B * k, 2k) of them instead of (B * k, V), the same sums in the same float order
        width = min(2 * k, lprobs.size(1))
        row_lprobs, row_tok = lprobs.topk(width, dim=1)
        cand = (beams.cum.view(-1, 1) + row_lprobs).view(bsz, k * width)
        top_scores, top_idx = cand.topk(min(2 * k, k * width), dim=1)
        top_beam = torch.div(top_idx, width, rounding_mode="floor")
        base = (torch.arange(bsz, device=lprobs.device) * k).unsqueeze(1)
        return top_scores, row_tok.view(bsz, k * width).gather(1, top_idx), base + top_beam

    def _end_hypotheses(self, beams: _Beams, top_scores: Tensor, top_tok: Tensor, top_rows: Tensor,
                        step: int) -> None:
        """Finish the candidates that end in eos among each sentence's best k; without the stepwise penalty a
        sentence is done once k hypotheses are finished."""
        k = self.options.beam_size
        is_eos = top_tok.eq(self.eos) & top_scores.gt(-math.inf)
        is_eos[:, k:] = False
        is_eos &= ~beams.done.unsqueeze(1)
        if not is_eos.any():
            return
        self._finalize(is_eos, top_rows, top_scores, beams, step)
        if self.options.stepwise_len_penalty:
            return
        for b in is_eos.any(1).nonzero().flatten().tolist():
            if len(beams.finalized[b]) >= k:
                beams.done[b] = True

    def _keep_live(self, beams: _Beams, top_scores: Tensor, top_tok: Tensor, top_rows: Tensor, step: int) -> Tensor:
        """Extend the best k candidates that did not end; returns the parent row of each new row."""
        live = top_scores.masked_fill(top_tok.eq(self.eos), -math.inf)
        keep_scores, keep_pos = live.topk(self.options.beam_size, dim=1)
        rows = top_rows.gather(1, keep_pos).flatten()
        prev_cum = beams.cum.view(-1)[rows]
        beams.tokens = beams.tokens[rows]
        beams.tokens[:, step + 1] = top_tok.gather(1, keep_pos).flatten()
        beams.pos_scores = beams.pos_scores[rows]
        beams.pos_scores[:, step] = keep_scores.flatten() - prev_cum
        beams.cum = keep_scores
        if self.options.stepwise_len_penalty:
            beams.done |= self._cannot_improve(beams.finalized, beams.cum, step, beams.max_len, beams.context)
        beams.cum[beams.done] = -math.inf
        return rows

    def _cannot_improve(self, finalized: list[list[Hypothesis]], cum: Tensor, step: int, max_len: Tensor,
                        context: Tensor | None = None) -> Tensor:
        """Per sentence: beam_size hypotheses finished and none of its live ones (cumulative log-prob ``cum``,
        which only falls) can reach the worst of them at any length it may still end at."""
        alpha = self.options.len_penalty
        out = torch.zeros(len(finalized), dtype=torch.bool, device=cum.device)
        for b, hyps in enumerate(finalized):
            if len(hyps) < self.options.beam_size:
                continue
            best_live = float(cum[b].max())
            # score = cum / len**alpha with cum <= 0: the best length is the longest for alpha > 0, else the shortest
            length = int(max_len[b]) + 1 if alpha > 0 else step + 2
            length -= 0 if context is None else int(context[b])  # a prompt is not counted
            out[b] = best_live / (length**alpha) <= min(h.score for h in hyps)
        return out

    def _finalize(self, is_eos: Tensor, top_rows: Tensor, top_scores: Tensor, beams: _Beams, step: int) -> None:
        flat_cum, tokens, pos_scores, finalized = beams.cum.view(-1), beams.tokens, beams.pos_scores, beams.finalized
        stepwise = self.options.stepwise_len_penalty
        for b, j in is_eos.nonzero().tolist():
            full = len(finalized[b]) >= self.options.beam_size
            if full and not stepwise:
                continue
            row = int(top_rows[b, j])
            total = float(top_scores[b, j])
            ctx = 0 if beams.context is None else int(beams.context[b])  # a prompt's tokens are not output
            seq = torch.cat([tokens[row, 1 + ctx: step + 1], tokens.new_tensor([self.eos])])
            scores = pos_scores[row, : step + 1].clone()
            scores[step] = total - float(flat_cum[row])
            scores = scores[ctx:]
            length = step + 1 - ctx
            hyp = Hypothesis(seq, total / (length ** self.options.len_penalty), scores)
            if full:  # stepwise: a better hypothesis replaces the worst finished one
                worst = min(range(len(finalized[b])), key=lambda i: finalized[b][i].score)
                if hyp.score > finalized[b][worst].score:
                    finalized[b][worst] = hyp
                continue
            finalized[b].append(hyp)
