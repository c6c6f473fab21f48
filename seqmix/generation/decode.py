"""Decoding a whole dataset in token-budget batches, in the dataset's order, with any decoding algorithm.

One loop (batches sorted by length, collated, decoded, written back by example id) serves beam search, sampling and
iterative NAT decoding alike: the algorithm is a :data:`Translate` callable (:func:`beam_translator`,
:func:`nat_translator`). ``generate.py`` and the Python API (through the tasks' ``decode_outputs``) and the
decoding benchmark use it. Forced prefixes come from the dataset's targets (``prefix_size``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from seqmix.data import PairDataset, TokenBudgetBatchSampler, collate_pairs
from seqmix.generation.beam_search import BeamSearch, Hypothesis
from seqmix.generation.memory import keep_freed_memory
from seqmix.generation.nat_decoding import IterativeDecoder
from seqmix.models.compiled import for_decoding

# (source rows (B, S) on the model's device, forced prefix rows (B, P) right-padded or None) -> (per row: the
# chosen output's token ids without eos, None when the decoder produced nothing, or its hypotheses best first (each
# ending in eos); per row: decoder passes spent, or None when the algorithm does not count them)
Translate = Callable[[Tensor, Tensor | None], tuple[Sequence[Tensor | list[Hypothesis] | None], list[int] | None]]


@dataclass
class TextHypothesis:
    """One output as a user gets it: detokenized ``text``, its ``score`` (``sum(log p) / length ** len_penalty``,
    length counting eos) and ``positional_scores`` (log p of each token, eos last); ``pieces``: its vocabulary
    tokens. Scores are None where the decoder gives none (NAT)."""

    text: str
    score: float | None = None
    positional_scores: list[float] | None = None
    pieces: list[str] | None = None


@dataclass
class Decoded:
    hypotheses: list[str]  # detokenized, in dataset order ("" where the decoder produced nothing)
    generated: int = 0  # output tokens plus one eos per produced hypothesis
    iterations: list[int] | None = None  # per example, when the translator reports them
    batch_sizes: list[int] = field(default_factory=list)  # examples per batch, in decoding order
    nbest: list[list[TextHypothesis]] | None = None  # per example, when the translator gives hypotheses


def best_tokens(output: Tensor | list[Hypothesis] | None) -> Tensor | None:
    """The chosen output's tokens without eos, from either form a :data:`Translate` returns for a row."""
    if isinstance(output, list):
        return output[0].tokens[:-1] if output else None
    return output


def text_hypothesis(hyp: Hypothesis, tokenizer, prompt: list[int] = ()) -> TextHypothesis:
    """``hyp`` for users; a ``prompt`` it continues is detokenized with it (a subword may continue a prompt's
    word), while pieces and scores stay the hypothesis's own."""
    tokens = hyp.tokens[:-1].tolist()
    return TextHypothesis(tokenizer.decode([*prompt, *tokens]), float(hyp.score),
                          [float(x) for x in hyp.positional_scores], [tokenizer.piece(t) for t in tokens])


def beam_translator(model, search: BeamSearch, compile_decoding: bool | str = False,
                    context: bool = False) -> Translate:
    """Every hypothesis the search returns per row, best first (a :class:`~seqmix.generation.sampling.Sampler`: its
    samples); forced prefixes as output, or as ``context`` (a language model's prompt). ``compile_decoding``: the
    decoder step compiled (``seqmix.models.compiled``)."""
    model = for_decoding(model, compile_decoding)

    def translate(src_tokens: Tensor, prefix: Tensor | None = None):
        return search.generate(model, src_tokens, prefix, context), None

    return translate


def nat_translator(model, decoder: IterativeDecoder, compile_decoding: bool | str = False) -> Translate:
    """The chosen candidate of each row and the decoder passes spent on it (no forced prefixes). ``compile_decoding``:
    the decoder pass compiled (``seqmix.models.compiled``)."""
    model = for_decoding(model, compile_decoding)

    def translate(src_tokens: Tensor, prefix: Tensor | None = None):
        result = decoder.generate(model, src_tokens)
        return result.tokens, result.iterations.tolist()

    return translate


def prefix_rows(target: Tensor, prefix_size: int | None, eos: int, pad: int) -> Tensor:
    """The first ``prefix_size`` tokens (None: all) of each target row, without its eos; pad after."""
    rows = target.masked_fill(target.eq(eos), pad)
    return rows if prefix_size is None else rows[:, :prefix_size]


def collated_batches(dataset: PairDataset, tokenizer, max_tokens: int,
                     max_sentences: int | None = None) -> Iterator[dict]:
    """``dataset`` in ``generate.py``'s batches (token budget, sorted by length, at most ``max_sentences`` each),
    collated; the examples' ``id`` say where each row belongs."""
    sampler = TokenBudgetBatchSampler(dataset.src_sizes, dataset.tgt_sizes, max_tokens=max_tokens,
                                      max_sentences=max_sentences, shuffle=False)
    for batch_idx in sampler:
        yield collate_pairs([dataset[i] for i in batch_idx], tokenizer.pad, tokenizer.bos, tokenizer.eos)


def decode_dataset(dataset: PairDataset, tokenizer, translate: Translate, max_tokens: int, device: torch.device,
                   max_sentences: int | None = None, prefix_size: int | None = 0, nbest: int = 0) -> Decoded:
    """Every source of ``dataset`` decoded by ``translate`` in ``generate.py``'s batches (token budget, sorted by
    length, at most ``max_sentences`` per batch), the first ``prefix_size`` tokens of each target forced (None: the
    whole target, a prompt: hypothesis texts are then the prompt continued; 0: nothing). ``nbest``: how many
    hypotheses of each example to keep with their scores (``Decoded.nbest``; 0: only the best text)."""
    out = Decoded([""] * len(dataset))
    if device.type == "cpu":
        keep_freed_memory()
    with torch.inference_mode():
        for batch in collated_batches(dataset, tokenizer, max_tokens, max_sentences):
            out.batch_sizes.append(len(batch["id"]))
            prefix = None
            if prefix_size != 0:
                prefix = prefix_rows(batch["target"], prefix_size, tokenizer.eos, tokenizer.pad).to(device)
            outputs, iterations = translate(batch["src_tokens"].to(device), prefix)
            ids = batch["id"].tolist()
            for row, (i, output) in enumerate(zip(ids, outputs)):
                prompt = [] if prefix_size is not None else [t for t in prefix[row].tolist() if t != tokenizer.pad]
                if isinstance(output, list) and nbest:
                    out.nbest = out.nbest or [[] for _ in range(len(dataset))]
                    out.nbest[i] = [text_hypothesis(h, tokenizer, prompt) for h in output[:nbest]]
                t = best_tokens(output)
                if t is not None:
                    out.generated += len(t) + 1
                    out.hypotheses[i] = tokenizer.decode([*prompt, *t.tolist()] if prompt else t)
            if iterations is not None:
                out.iterations = out.iterations or [0] * len(dataset)
                for i, n in zip(ids, iterations):
                    out.iterations[i] = n
    return out
