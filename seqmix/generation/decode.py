"""Decoding a whole dataset in token-budget batches, in the dataset's order."""

from __future__ import annotations

import torch

from seqmix.data import PairDataset, TokenBudgetBatchSampler, collate_pairs
from seqmix.generation.beam_search import BeamSearch


def decode_dataset(model, tokenizer, dataset: PairDataset, search: BeamSearch, max_tokens: int,
                   device: torch.device, max_sentences: int | None = None) -> tuple[list[str], int]:
    """Best hypothesis of every source (detokenized) and the number of tokens generated."""
    sampler = TokenBudgetBatchSampler(dataset.src_sizes, dataset.tgt_sizes, max_tokens=max_tokens,
                                      max_sentences=max_sentences, shuffle=False)
    hyps = [""] * len(dataset)
    generated = 0
    with torch.inference_mode():
        for batch_idx in sampler:
            batch = collate_pairs([dataset[i] for i in batch_idx], tokenizer.pad, tokenizer.bos, tokenizer.eos)
            for i, h in zip(batch["id"].tolist(), search.generate(model, batch["src_tokens"].to(device))):
                if h:
                    generated += len(h[0].tokens)
                    hyps[i] = tokenizer.decode(h[0].tokens.tolist())
    return hyps, generated
