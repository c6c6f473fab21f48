"""LanguageModelingTask: a decoder-only model trained on NLL; perplexity over whole splits.

Perplexity is exp(total NLL / number of predicted tokens) over every token of the split, ``</s>`` included,
in the vocabulary's units (words for a word-level vocabulary, subwords for BPE). How much history each token
sees is set by ``tokens_per_sample`` and ``eval_context`` (see ``seqmix.data.lm_blocks``).
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn

from seqmix.data import PairDataset
from seqmix.data.batching import TokenBudgetBatchSampler
from seqmix.data.lm_blocks import collate_blocks, make_blocks
from seqmix.errors import SeqmixError
from seqmix.generation.scoring import ScoredCorpus, lm_token_log_probs, score_dataset
from seqmix.metrics import perplexity
from seqmix.tasks.base import Report, SeqmixTask

log = logging.getLogger("seqmix")


class LanguageModelingTask(SeqmixTask):
    def __init__(self, model: nn.Module, tokenizer, optimizer, scheduler=None, run_config: dict | None = None,
                 tokens_per_sample: int = 512, break_mode: str = "none", eval_context: int = 0) -> None:
        super().__init__(model, tokenizer, optimizer, scheduler, run_config)
        self.tokens_per_sample, self.break_mode, self.eval_context = tokens_per_sample, break_mode, eval_context

    def dashboard_tokens(self, batch: dict) -> dict[str, Tensor]:
        return {"decoder": batch["tokens"][0]}

    def compute_loss(self, batch: dict) -> tuple[Tensor, Tensor, int]:
        """Plain NLL (no label smoothing: it would need the full softmax the adaptive one avoids)."""
        nll = self.model.nll(self.model(batch["tokens"]), batch["target"]).sum()
        return nll, nll, int(batch["ntokens"])

    def _report(self, nll: float, ntokens: int, eval_context: int) -> Report:
        ppl = perplexity(nll, ntokens)
        units = "words" if getattr(self.tokenizer, "kind", "bpe") == "word" else "subword tokens"
        context = f"{self.tokens_per_sample}-token samples, break_mode={self.break_mode}"
        if eval_context:
            context += f", +{eval_context} tokens of unscored context"
        return Report(ppl, f"perplexity: {ppl:.2f}",
                      [f"over {ntokens:,} {units} incl. </s> (mean NLL {nll / max(ntokens, 1):.4f} nats; {context})"],
                      metrics={"perplexity": ppl})

    def corpus_report(self, split: str, prefix: str, by_id: dict, nll: float, ntokens: int) -> Report:
        return self._report(nll, ntokens, self.eval_context)

    def decoding_settings(self, eval_context: int | None = None, **_) -> str:
        context = self.eval_context if eval_context is None else int(eval_context)
        return (f"perplexity tokens_per_sample={self.tokens_per_sample} break_mode={self.break_mode} "
                f"eval_context={context}")

    @torch.inference_mode()
    def evaluate_texts(self, sources: list[str], references=None, max_tokens: int = 8000,
                       eval_context: int | None = None, **_) -> tuple[None, Report]:
        """Perplexity of ``sources`` (lines, each followed by ``</s>``) with the training block settings."""
        context = self.eval_context if eval_context is None else int(eval_context)
        longest = self.tokens_per_sample + context
        if longest > self.model.max_positions:
            raise SeqmixError(f"tokens_per_sample + eval_context = {longest} exceeds the model's "
                              f"{self.model.max_positions} positions; lower eval_context")
        tok = self.tokenizer
        ds = make_blocks(tok.encode_batch(sources), tok.eos, tok.pad, self.tokens_per_sample, self.break_mode,
                         context)
        sampler = TokenBudgetBatchSampler(ds.sizes, ds.sizes, max(max_tokens, longest), shuffle=False)
        device = next(self.model.parameters()).device
        nll, ntokens = 0.0, 0
        for idx in sampler:
            batch = collate_blocks([ds[i] for i in idx], tok.pad)
            nll += float(self.model.nll(self.model(batch["tokens"].to(device)), batch["target"].to(device)).sum())
            ntokens += batch["ntokens"]
        return None, self._report(nll, ntokens, context)

    @torch.inference_mode()
    def score_texts(self, texts: list[str], targets: None = None, max_tokens: int = 8000,
                    max_sentences: int | None = None, **_) -> ScoredCorpus:
        """Log-probabilities of each text's tokens and its ``</s>``, every text alone behind ``</s>`` (as
        ``break_mode=eos`` models lines: no context from the texts before it); sentence scores are per-token means."""
        tok = self.tokenizer
        ids = tok.encode_batch(texts)
        too_long = [i + 1 for i, t in enumerate(ids) if len(t) + 1 > self.model.max_positions]
        if too_long:
            raise SeqmixError(f"{len(too_long)} lines are longer than the model's {self.model.max_positions} "
                              f"positions (lines {too_long[:5]}...); they cannot be scored alone")
        dataset = PairDataset.from_lists([[] for _ in ids], ids, texts, texts, eos=tok.eos)
        device = next(self.model.parameters()).device
        model = self.model
        return score_dataset(lambda _src, tgt: lm_token_log_probs(model, tgt, tok.eos, tok.pad), dataset, tok, 1.0,
                             max_tokens, device, max_sentences)
