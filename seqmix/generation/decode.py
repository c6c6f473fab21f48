"""Decoding a whole dataset in token-budget batches, in the dataset's order, with any decoding algorithm.

One loop (batches sorted by length, collated, decoded, written back by example id) serves beam search and
iterative NAT decoding alike: the algorithm is a :data:`Translate` callable (:func:`beam_translator`,
:func:`nat_translator`). ``generate.py`` (through the tasks' ``evaluate_texts``) and the decoding benchmark use it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from seqmix.data import PairDataset, TokenBudgetBatchSampler, collate_pairs
from seqmix.generation.beam_search import BeamSearch
from seqmix.generation.nat_decoding import IterativeDecoder
from seqmix.models.compiled import for_decoding

# source rows (B, S) on the model's device -> (per row: the chosen output's token ids without eos, None when the
# decoder produced nothing; per row: decoder passes spent, or None when the algorithm does not count them)
Translate = Callable[[Tensor], tuple[Sequence[Tensor | None], list[int] | None]]


@dataclass
class Decoded:
    hypotheses: list[str]  # detokenized, in dataset order ("" where the decoder produced nothing)
    generated: int = 0  # output tokens plus one eos per produced hypothesis
    iterations: list[int] | None = None  # per example, when the translator reports them
    batch_sizes: list[int] = field(default_factory=list)  # examples per batch, in decoding order


def beam_translator(model, search: BeamSearch, compile_decoding: bool | str = False) -> Translate:
    """The best hypothesis of each row (its tokens end in eos, which is dropped). ``compile_decoding``: the
    decoder step compiled (``seqmix.models.compiled``)."""
    model = for_decoding(model, compile_decoding)

    def translate(src_tokens: Tensor):
        return [h[0].tokens[:-1] if h else None for h in search.generate(model, src_tokens)], None

    return translate


def nat_translator(model, decoder: IterativeDecoder, compile_decoding: bool | str = False) -> Translate:
    """The chosen candidate of each row and the decoder passes spent on it. ``compile_decoding``: the decoder pass
    compiled (``seqmix.models.compiled``)."""
    model = for_decoding(model, compile_decoding)

    def translate(src_tokens: Tensor):
        result = decoder.generate(model, src_tokens)
        return result.tokens, result.iterations.tolist()

    return translate


def collated_batches(dataset: PairDataset, tokenizer, max_tokens: int,
                     max_sentences: int | None = None) -> Iterator[dict]:
    """``dataset`` in ``generate.py``'s batches (token budget, sorted by length, at most ``max_sentences`` each),
    collated; the examples' ``id`` say where each row belongs."""
    sampler = TokenBudgetBatchSampler(dataset.src_sizes, dataset.tgt_sizes, max_tokens=max_tokens,
                                      max_sentences=max_sentences, shuffle=False)
    for batch_idx in sampler:
        yield collate_pairs([dataset[i] for i in batch_idx], tokenizer.pad, tokenizer.bos, tokenizer.eos)


def decode_dataset(dataset: PairDataset, tokenizer, translate: Translate, max_tokens: int, device: torch.device,
                   max_sentences: int | None = None) -> Decoded:
    """Every source of ``dataset`` decoded by ``translate`` in ``generate.py``'s batches (token budget, sorted by
    length, at most ``max_sentences`` per batch)."""
    out = Decoded([""] * len(dataset))
    with torch.inference_mode():
        for batch in collated_batches(dataset, tokenizer, max_tokens, max_sentences):
            out.batch_sizes.append(len(batch["id"]))
            tokens, iterations = translate(batch["src_tokens"].to(device))
            ids = batch["id"].tolist()
            for i, t in zip(ids, tokens):
                if t is not None:
                    out.generated += len(t) + 1
                    out.hypotheses[i] = tokenizer.decode(t)
            if iterations is not None:
                out.iterations = out.iterations or [0] * len(dataset)
                for i, n in zip(ids, iterations):
                    out.iterations[i] = n
    return out
