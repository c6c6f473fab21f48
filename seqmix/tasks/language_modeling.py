"""LanguageModelingTask: a decoder-only model trained on NLL; perplexity over whole splits.

Perplexity is exp(total NLL / number of predicted tokens) over every token of the split, ``</s>`` included,
in the vocabulary's units (words for a word-level vocabulary, subwords for BPE). How much history each token
sees is set by ``tokens_per_sample`` and ``eval_context`` (see ``seqmix.data.lm_blocks``).

Given decoding options (any beam option, ``nbest``, or sampling), a language model continues each input line
instead (:meth:`LanguageModelingTask.decode_outputs`): the line is the prompt, read behind ``</s>`` as a line
begins in training, and beam search or sampling extends it by at most ``max_len_b`` new tokens.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn

from seqmix.data import PairDataset
from seqmix.data.batching import TokenBudgetBatchSampler
from seqmix.data.lm_blocks import collate_blocks, make_blocks
from seqmix.errors import SeqmixError
from seqmix.generation import BeamSearch
from seqmix.generation.continuation import PromptedLanguageModel
from seqmix.generation.decode import TextHypothesis, beam_translator, decode_dataset
from seqmix.generation.options import BeamOptions, DecodeRequest, option_names, overridden, settings_text
from seqmix.generation.sampling import Sampler
from seqmix.generation.scoring import ScoredCorpus, lm_token_log_probs, score_dataset
from seqmix.generation.word_ngrams import word_boundaries_for
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

    def decoding_settings(self, eval_context: int | None = None, request: DecodeRequest | None = None,
                          **overrides) -> str:
        if self.continues(request, overrides):
            options = self.continuation_options(**overrides)
            if request is not None and request.sampling is not None:
                s = request.sampling
                return (f"continuation by sampling nbest={request.nbest} top_k={s.top_k} top_p={s.top_p} "
                        f"temperature={s.temperature} seed={s.seed} max_len_b={options.max_len_b} "
                        f"min_len_b={options.min_len_b}")
            nbest = f" nbest={request.nbest}" if request is not None and request.nbest > 1 else ""
            return f"continuation by beam search {settings_text(options)}{nbest}"
        context = self.eval_context if eval_context is None else int(eval_context)
        return (f"perplexity tokens_per_sample={self.tokens_per_sample} break_mode={self.break_mode} "
                f"eval_context={context}")

    # --- continuation --------------------------------------------------------------------------
    @staticmethod
    def continues(request: DecodeRequest | None, overrides: dict) -> bool:
        """The rule: decoding options (nbest, sampling, or any beam option given) mean continue the lines; none
        mean measure their perplexity."""
        beam = set(option_names(BeamOptions))
        return (request is not None and not request.plain) or any(overrides.get(k) is not None for k in beam)

    def continuation_options(self, **overrides) -> BeamOptions:
        """Beam search's defaults (beam 5, at most 200 new tokens), with ``overrides``; lengths count new tokens."""
        return overridden(BeamOptions(), overrides, "a language model's continuation")

    @torch.inference_mode()
    def decode_outputs(self, sources: list[str], references=None, max_tokens: int = 8000,
                       max_sentences: int | None = None, request: DecodeRequest | None = None,
                       eval_context: int | None = None, **overrides) -> tuple[list[list[TextHypothesis]] | None,
                                                                              Report | None]:
        """With decoding options (:meth:`continues`): per line its continuations (``request.nbest`` of them, best
        first; scores are the continuation's log-probabilities given the line), no report. Without: no outputs and
        the perplexity report of :meth:`evaluate_texts`."""
        if not self.continues(request, overrides):
            if max_sentences is not None:
                raise SeqmixError("max_sentences= bounds decoding batches; perplexity is measured in blocks of "
                                  "tokens_per_sample: drop it")
            return self.evaluate_texts(sources, references, max_tokens, eval_context=eval_context)
        request = request or DecodeRequest()
        options = self.continuation_options(**overrides)
        if request.prefix_size:
            raise SeqmixError("prefix_size= forces the start of references; a language model continues each whole "
                              "input line already: drop it")
        if request.sampling is not None and overrides.get("beam_size") not in (None, 1):
            raise SeqmixError(f"sampling=true draws samples instead of a beam search: drop beam_size="
                              f"{overrides['beam_size']} (or set beam_size=1); nbest=N gives N samples per prompt")
        if request.sampling is None and request.nbest > options.beam_size:
            raise SeqmixError(f"nbest={request.nbest} is more than the beam keeps (beam_size={options.beam_size}): "
                              f"raise beam_size to at least {request.nbest} or lower nbest")
        tok = self.tokenizer
        where = {"max_target_positions": self.model.max_positions, "start": tok.eos,
                 "words": word_boundaries_for(options, tok)}
        search = (Sampler(tok.bos, tok.eos, tok.pad, options, request.sampling, request.nbest, **where)
                  if request.sampling is not None else BeamSearch(tok.bos, tok.eos, tok.pad, options, **where))
        translate = beam_translator(PromptedLanguageModel(self.model), search, self.compile_decoding, context=True)
        ids = tok.encode_batch(sources)
        too_long = [i + 1 for i, t in enumerate(ids) if len(t) + 2 > self.model.max_positions - 1]
        if too_long:
            raise SeqmixError(f"{len(too_long)} prompts leave no room in the model's {self.model.max_positions} "
                              f"positions (lines {too_long[:5]}...); shorten them")
        dataset = PairDataset.from_lists(ids, ids, sources, sources, eos=tok.eos)
        device = next(self.model.parameters()).device
        decoded = decode_dataset(dataset, tok, translate, max_tokens, device, max_sentences, prefix_size=None,
                                 nbest=request.nbest)
        return [hyps[: request.nbest] for hyps in (decoded.nbest or [])], None

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
