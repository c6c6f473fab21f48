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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


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


class BeamSearch:
    def __init__(self, bos: int, eos: int, pad: int, beam_size: int = 5, max_len_a: float = 0.0,
                 max_len_b: int = 200, min_len_a: float = 0.0, min_len_b: int = 1, len_penalty: float = 1.0,
                 no_repeat_ngram_size: int = 0, incremental: bool = True, max_target_positions: int | None = None,
                 unk: int | None = None, unk_penalty: float = 0.0, stepwise_len_penalty: bool = False) -> None:
        if beam_size < 1:
            raise ValueError("beam_size must be >= 1")
        self.bos, self.eos, self.pad, self.unk = bos, eos, pad, unk
        self.beam_size = beam_size
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self.min_len_a, self.min_len_b = min_len_a, min_len_b
        self.len_penalty = len_penalty
        self.no_repeat_ngram_size = no_repeat_ngram_size
        self.incremental = incremental
        self.max_target_positions = max_target_positions
        self.unk_penalty = unk_penalty
        self.stepwise_len_penalty = stepwise_len_penalty

    def length_bounds(self, src_tokens: Tensor) -> tuple[Tensor, Tensor]:
        src_len = src_tokens.ne(self.pad).sum(1).float()
        max_len = (self.max_len_a * src_len + self.max_len_b).long()
        if self.max_target_positions is not None:
            max_len = max_len.clamp(max=self.max_target_positions - 1)
        max_len = max_len.clamp(min=1)
        min_len = (self.min_len_a * src_len + self.min_len_b).long().clamp(min=0)
        return min_len.minimum(max_len), max_len

    @torch.no_grad()
    def generate(self, model, src_tokens: Tensor) -> list[list[Hypothesis]]:
        """Best-first hypotheses for each source row."""
        bsz, k = src_tokens.size(0), self.beam_size
        device = src_tokens.device
        min_len, max_len = self.length_bounds(src_tokens)
        rows_min = min_len.repeat_interleave(k)
        rows_max = max_len.repeat_interleave(k)
        steps = int(max_len.max())

        encoder_out = model.encode(src_tokens)
        encoder_out = encoder_out.index_select(torch.arange(bsz, device=device).repeat_interleave(k))
        state = model.init_decoder_state(encoder_out) if self.incremental else None

        tokens = torch.full((bsz * k, steps + 2), self.pad, dtype=torch.long, device=device)
        tokens[:, 0] = self.bos
        pos_scores = torch.zeros(bsz * k, steps + 1, device=device)
        cum = torch.zeros(bsz, k, device=device)
        cum[:, 1:] = -math.inf  # at step 0 every beam holds the same prefix: keep one
        finalized: list[list[Hypothesis]] = [[] for _ in range(bsz)]
        done = torch.zeros(bsz, dtype=torch.bool, device=device)
        base = (torch.arange(bsz, device=device) * k).unsqueeze(1)

        for step in range(steps + 1):
            if state is not None:
                logits = model.decode(tokens[:, step: step + 1], encoder_out, state)[:, -1]
            else:
                logits = model.decode(tokens[:, : step + 1], encoder_out)[:, -1]
            lprobs = F.log_softmax(logits.float(), dim=-1)
            lprobs[:, self.pad] = -math.inf
            lprobs[:, self.bos] = -math.inf
            if self.unk is not None and self.unk_penalty:
                lprobs[:, self.unk] -= self.unk_penalty
            lprobs[rows_min > step, self.eos] = -math.inf
            at_max = rows_max <= step
            if at_max.any():  # the only move left is to end the hypothesis
                eos_col = lprobs[at_max, self.eos].clone()
                lprobs[at_max] = -math.inf
                lprobs[at_max, self.eos] = eos_col
            if self.no_repeat_ngram_size > 0:
                ban_repeated_ngrams(lprobs, tokens[:, 1: step + 1], self.no_repeat_ngram_size)

            vocab = lprobs.size(1)
            cand = (cum.view(-1, 1) + lprobs).view(bsz, k * vocab)
            top_scores, top_idx = cand.topk(min(2 * k, k * vocab), dim=1)
            top_beam = torch.div(top_idx, vocab, rounding_mode="floor")
            top_tok = top_idx % vocab
            top_rows = base + top_beam  # (B, 2k) row of the parent hypothesis

            is_eos = top_tok.eq(self.eos) & top_scores.gt(-math.inf)
            is_eos[:, k:] = False
            is_eos &= ~done.unsqueeze(1)
            if is_eos.any():
                self._finalize(is_eos, top_rows, top_scores, cum, tokens, pos_scores, step, finalized)
                for b in is_eos.any(1).nonzero().flatten().tolist():
                    if len(finalized[b]) >= k and not self.stepwise_len_penalty:
                        done[b] = True
            if bool(done.all()) or step == steps:
                break

            # keep the best k candidates that did not end
            live = top_scores.masked_fill(top_tok.eq(self.eos), -math.inf)
            keep_scores, keep_pos = live.topk(k, dim=1)
            rows = top_rows.gather(1, keep_pos).flatten()
            new_tok = top_tok.gather(1, keep_pos).flatten()
            prev_cum = cum.view(-1)[rows]
            tokens = tokens[rows]
            tokens[:, step + 1] = new_tok
            pos_scores = pos_scores[rows]
            pos_scores[:, step] = keep_scores.flatten() - prev_cum
            cum = keep_scores
            if self.stepwise_len_penalty:
                done |= self._cannot_improve(finalized, cum, step, max_len)
            cum[done] = -math.inf
            if bool(done.all()):
                break
            if state is not None:
                state.reorder(rows)

        return [sorted(f, key=lambda h: -h.score)[:k] for f in finalized]

    def _cannot_improve(self, finalized: list[list[Hypothesis]], cum: Tensor, step: int, max_len: Tensor) -> Tensor:
        """Per sentence: beam_size hypotheses finished and none of its live ones (cumulative log-prob ``cum``,
        which only falls) can reach the worst of them at any length it may still end at."""
        alpha = self.len_penalty
        out = torch.zeros(len(finalized), dtype=torch.bool, device=cum.device)
        for b, hyps in enumerate(finalized):
            if len(hyps) < self.beam_size:
                continue
            best_live = float(cum[b].max())
            # score = cum / len**alpha with cum <= 0: the best length is the longest for alpha > 0, else the shortest
            length = int(max_len[b]) + 1 if alpha > 0 else step + 2
            out[b] = best_live / (length**alpha) <= min(h.score for h in hyps)
        return out

    def _finalize(self, is_eos: Tensor, top_rows: Tensor, top_scores: Tensor, cum: Tensor, tokens: Tensor,
                  pos_scores: Tensor, step: int, finalized: list[list[Hypothesis]]) -> None:
        flat_cum = cum.view(-1)
        for b, j in is_eos.nonzero().tolist():
            full = len(finalized[b]) >= self.beam_size
            if full and not self.stepwise_len_penalty:
                continue
            row = int(top_rows[b, j])
            total = float(top_scores[b, j])
            seq = torch.cat([tokens[row, 1: step + 1], tokens.new_tensor([self.eos])])
            scores = pos_scores[row, : step + 1].clone()
            scores[step] = total - float(flat_cum[row])
            length = step + 1
            hyp = Hypothesis(seq, total / (length ** self.len_penalty), scores)
            if full:  # stepwise: a better hypothesis replaces the worst finished one
                worst = min(range(len(finalized[b])), key=lambda i: finalized[b][i].score)
                if hyp.score > finalized[b][worst].score:
                    finalized[b][worst] = hyp
                continue
            finalized[b].append(hyp)
