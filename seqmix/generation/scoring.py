"""Teacher-forced log-probabilities of given outputs (fairseq's ``--score-reference``): how likely a model (or an
:class:`~seqmix.generation.ensemble.Ensemble`) finds each token of a reference, by one full decoder pass per batch.

Scores follow beam search's conventions, so a beam hypothesis scored here gets its beam score back: log-softmax over
the whole vocabulary (nothing renormalized), the target ends in eos, which is scored and counted in the length, and a
sentence's score is ``sum(log p) / length ** len_penalty``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from seqmix.data import PairDataset
from seqmix.generation.decode import collated_batches
from seqmix.generation.ensemble import log_probs
from seqmix.generation.memory import keep_freed_memory

# (source rows, right-padded target rows) -> (B, T) log-probabilities of the target tokens, 0 at padding
TokenScorer = Callable[[Tensor, Tensor], Tensor]


def shifted_right(target: Tensor, start: int, pad: int) -> Tensor:
    """The decoder's input for ``target``: ``start``, then the target without its last token (pads stay pads)."""
    prev = torch.cat([target.new_full((target.size(0), 1), start), target[:, :-1]], dim=1)
    return prev.masked_fill(target.eq(pad), pad)


def token_log_probs(model, src_tokens: Tensor, target: Tensor, start: int, pad: int) -> Tensor:
    """(B, T) log p(target[b, t] | source b, target[b, :t]) of right-padded ``target`` rows (each ending in eos),
    0 at padding; the decoder reads ``start`` and then the target shifted right."""
    lprobs = log_probs(model.decode(shifted_right(target, start, pad), model.encode(src_tokens)))
    return lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1).masked_fill(target.eq(pad), 0.0)


def lm_token_log_probs(model, target: Tensor, start: int, pad: int) -> Tensor:
    """A language model's (``DecoderOnly``) (B, T) log p(target[b, t] | target[b, :t]), each row a text alone
    behind ``start`` (eos: how a line begins in the training stream), 0 at padding."""
    return -model.nll(model(shifted_right(target, start, pad)), target)


def sentence_scores(positional: Tensor, target: Tensor, pad: int, len_penalty: float) -> Tensor:
    """(B,) ``sum(log p) / length ** len_penalty`` with length counting eos, as beam search ranks hypotheses."""
    lengths = target.ne(pad).sum(1).to(positional.dtype)
    return positional.sum(1) / lengths**len_penalty


@dataclass
class Scored:
    score: float  # length-normalized total log-probability
    positional_scores: Tensor  # log-probability of each target token, eos included


@dataclass
class ScoredCorpus:
    sentences: list[Scored]  # in dataset order
    log_prob: float  # summed over every target token
    ntokens: int  # target tokens, one eos per sentence included

    @property
    def mean_log_prob(self) -> float:
        return self.log_prob / max(self.ntokens, 1)

    @property
    def perplexity(self) -> float:
        return math.exp(-self.mean_log_prob)


def score_dataset(scorer: TokenScorer, dataset: PairDataset, tokenizer, len_penalty: float, max_tokens: int,
                  device: torch.device, max_sentences: int | None = None) -> ScoredCorpus:
    """Every target of ``dataset`` scored by ``scorer`` given its source, in ``generate.py``'s batches."""
    sentences: list[Scored | None] = [None] * len(dataset)
    total, ntokens = 0.0, 0
    if device.type == "cpu":
        keep_freed_memory()
    with torch.inference_mode():
        for batch in collated_batches(dataset, tokenizer, max_tokens, max_sentences):
            target = batch["target"].to(device)
            positional = scorer(batch["src_tokens"].to(device), target)
            scores = sentence_scores(positional, target, tokenizer.pad, len_penalty)
            lengths = target.ne(tokenizer.pad).sum(1)
            total += float(positional.double().sum())
            ntokens += int(lengths.sum())
            for i, row, score, n in zip(batch["id"].tolist(), positional.cpu(), scores.tolist(), lengths.tolist()):
                sentences[i] = Scored(score, row[:n].clone())
    return ScoredCorpus(sentences, total, ntokens)
