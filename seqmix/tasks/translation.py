"""TranslationTask: label-smoothed training, validation loss + BLEU by beam search, test BLEU."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from seqmix.data import PairDataset
from seqmix.errors import SeqmixError
from seqmix.generation import BeamSearch
from seqmix.generation.decode import (
    Decoded,
    TextHypothesis,
    Translate,
    beam_translator,
    best_tokens,
    decode_dataset,
)
from seqmix.generation.options import BeamOptions, DecodeRequest, overridden, settings_text
from seqmix.generation.sampling import Sampler
from seqmix.generation.scoring import ScoredCorpus, score_dataset, token_log_probs
from seqmix.generation.word_ngrams import word_boundaries_for
from seqmix.metrics import BleuOptions, corpus_bleu, corpus_metric, paper_bleu
from seqmix.tasks.base import Report, SeqmixTask
from seqmix.tasks.fused_loss import projected_label_smoothed_loss
from seqmix.tasks.losses import label_smoothed_nll_loss


class TranslationTask(SeqmixTask):
    """Wraps an encoder-decoder model; owns loss, decoding and BLEU."""

    #: chrF/TER to report beside BLEU (``seqmix.metrics.chrf_ter.METRICS``); generate.py's ``metrics=`` sets it
    extra_metrics: tuple[str, ...] = ()

    def __init__(self, model: nn.Module, tokenizer, optimizer: Callable, scheduler: Callable | None = None,
                 label_smoothing: float = 0.1, generation: BeamOptions | None = None, bleu: BleuOptions | None = None,
                 eval_decode: bool = True, run_config: dict | None = None, fused_loss: bool = False,
                 eval_generation: dict | None = None) -> None:
        super().__init__(model, tokenizer, optimizer, scheduler, run_config)
        self.label_smoothing = label_smoothing
        self.fused_loss = fused_loss  # project + loss in row chunks (seqmix.tasks.fused_loss) when the model can
        self.generation = generation or BeamOptions()
        self.bleu = bleu or BleuOptions()
        self.eval_decode = eval_decode  # decode and score at every validation too (the final test always does)
        # validation's own decoding options (e.g. greedy, cheap during training), as fairseq's --eval-bleu-args; the
        # test, generate.py and the checkpoint's users decode with ``generation`` itself
        self.eval_generation = dict(eval_generation or {})

    @property
    def decoder_start(self) -> int:
        """The decoder's first input id: bos, or eos for models trained as fairseq's (``model.decoder_start``)."""
        return self.tokenizer.eos if getattr(self.model, "decoder_start", None) == "eos" else self.tokenizer.bos

    def dashboard_tokens(self, batch: dict) -> dict[str, Tensor]:
        return {"encoder": batch["src_tokens"][0], "decoder": self.decoder_inputs(batch)[0]}

    def decoder_inputs(self, batch: dict) -> Tensor:
        """``prev_output_tokens`` starting with the model's start symbol: the collate functions put bos in column 0
        of every row (targets shifted right, right-padded), which an eos-start model replaces."""
        prev = batch["prev_output_tokens"]
        start = self.decoder_start
        if start == self.tokenizer.bos or prev.numel() == 0:
            return prev
        prev = prev.clone()
        prev[:, 0] = start
        return prev

    # --- training ------------------------------------------------------------------------------
    def compute_loss(self, batch: dict) -> tuple[Tensor, Tensor, int]:
        """Summed label-smoothed loss and nll, and the target token count. With ``fused_loss`` and a model that
        exposes ``decode_features`` and ``output_weight``, the (tokens x vocabulary) logits are never built."""
        model, inputs = self.model, (batch["src_tokens"], self.decoder_inputs(batch))
        if self.fused_loss and hasattr(model, "decode_features") and hasattr(model, "output_weight"):
            features = self.compiled("features", self.decoder_features)(*inputs)
            return projected_label_smoothed_loss(features, model.output_weight(), batch["target"],
                                                 self.label_smoothing, self.tokenizer.pad, ntokens=batch.get("ntokens"))
        logits = self.compiled("logits", model.forward)(*inputs)
        return label_smoothed_nll_loss(logits, batch["target"], self.label_smoothing, self.tokenizer.pad,
                                       ntokens=batch.get("ntokens"))

    def decoder_features(self, src_tokens: Tensor, prev_output_tokens: Tensor) -> Tensor:
        """The model's decoder output before the output projection (what ``compile`` compiles with the fused loss)."""
        return self.model.decode_features(prev_output_tokens, self.model.encode(src_tokens))

    # --- decoding ------------------------------------------------------------------------------
    def beam_options(self, **overrides) -> BeamOptions:
        """``task.generation`` with ``overrides`` (beam options such as beam_size) replacing its fields."""
        return overridden(self.generation, overrides, f"{type(self).__name__}'s beam search")

    def beam_search(self, request: DecodeRequest | None = None, **overrides) -> BeamSearch:
        """The task's beam search (``task.generation``) with ``overrides`` (beam options such as beam_size), or with
        ``request.sampling`` a sampler of ``request.nbest`` samples under the same length bounds and bans."""
        options = self.beam_options(**overrides)
        tok = self.tokenizer
        where = {"max_target_positions": getattr(self.model, "max_target_positions", None),
                 "start": self.decoder_start, "words": word_boundaries_for(options, tok)}
        if request is not None and request.sampling is not None:
            return Sampler(tok.bos, tok.eos, tok.pad, options, request.sampling, request.nbest, **where)
        return BeamSearch(tok.bos, tok.eos, tok.pad, options, **where)

    def translator(self, request: DecodeRequest | None = None, **overrides) -> Translate:
        """The task's decoding algorithm for ``seqmix.generation.decode``, with ``overrides`` of its options."""
        return beam_translator(self.model, self.beam_search(request=request, **overrides), self.compile_decoding)

    def check_request(self, request: DecodeRequest, references, **overrides) -> None:
        """What ``request`` asks must fit the decoding options: samples come instead of a beam, n-best from one."""
        if request.sampling is not None:
            if overrides.get("beam_size") not in (None, 1):
                raise SeqmixError(f"sampling=true draws samples instead of a beam search: drop beam_size="
                                  f"{overrides['beam_size']} (or set beam_size=1); nbest=N gives N samples per input")
        elif request.nbest > self.beam_options(**overrides).beam_size:
            beam = self.beam_options(**overrides).beam_size
            raise SeqmixError(f"nbest={request.nbest} is more than the beam keeps (beam_size={beam}): raise "
                              f"beam_size to at least {request.nbest} or lower nbest")
        if request.prefix_size and references is None:
            raise SeqmixError(f"prefix_size={request.prefix_size} forces the first tokens of each reference, and "
                              "there are none: give reference=<file> with input=<file>, or a split of the task's data")

    def decoding_settings(self, request: DecodeRequest | None = None, **overrides) -> str:
        options = self.beam_options(**overrides)
        if request is not None and request.sampling is not None:
            s = request.sampling
            text = (f"sampling nbest={request.nbest} top_k={s.top_k} top_p={s.top_p} temperature={s.temperature} "
                    f"seed={s.seed} len_penalty={options.len_penalty} max_len_a={options.max_len_a} "
                    f"max_len_b={options.max_len_b} min_len_a={options.min_len_a} min_len_b={options.min_len_b} "
                    f"no_repeat_ngram_size={options.no_repeat_ngram_size} "
                    f"no_repeat_ngram_unit={options.no_repeat_ngram_unit}")
        else:
            text = f"beam search {settings_text(options)}"
            if request is not None and request.nbest > 1:
                text += f" nbest={request.nbest}"
        if request is not None and request.prefix_size:
            text += f" prefix_size={request.prefix_size}"
        return text

    # --- evaluation ----------------------------------------------------------------------------
    def _decoding(self) -> bool:
        return self.eval_decode or self.trainer.testing

    def eval_outputs(self, batch: dict) -> list:
        """(hypothesis, decoder passes or None) per example."""
        if not self._decoding():
            return []
        outputs, iterations = self.translator(**({} if self.trainer.testing else self.eval_generation))(
            batch["src_tokens"], None)
        tokens = [best_tokens(o) for o in outputs]
        hyps = [self.tokenizer.decode(t) if t is not None else "" for t in tokens]
        return list(zip(hyps, iterations or [None] * len(hyps)))

    def score(self, hypotheses: list[str], references: list[list[str]], sources: list[str]) -> Report:
        """Corpus BLEU against the first reference of each example (translation data has one): sacreBLEU (the
        headline, ``bleu``, with its brevity penalty ``bp`` and ``length_ratio``), then each of the papers' BLEU that
        ``task.bleu.paper`` names (``bleu_paper``...), then the chrF/TER of ``extra_metrics``."""
        refs, options = [r[0] for r in references], self.bleu
        result = corpus_bleu(hypotheses, refs, tokenize=options.tokenize, lowercase=options.lowercase,
                             tokenized=options.pretokenized)
        report = Report(result.score, f"BLEU: {result.score:.2f}", [f"sacreBLEU: {result}"],
                        metrics={"bleu": result.score, "bp": result.bp, "length_ratio": result.length_ratio})
        for name, kind in options.paper_metrics().items():
            paper = paper_bleu(hypotheses, refs, kind, options.lang, options.pretokenized)
            report.details.append(f"paper BLEU: {paper}")
            report.metrics[name] = paper.score
        for name in self.extra_metrics:
            extra = corpus_metric(name, hypotheses, refs, lowercase=options.lowercase)
            report.details.append(extra.line)
            report.metrics[extra.name] = extra.score
        return report

    def decoding_report(self, hypotheses: list[str], references: list[list[str]], sources: list[str],
                        iterations: list[int] | None = None, **overrides) -> Report:
        """``score`` of decoded outputs; a decoder that counts its passes (``iterations``, decoded with
        ``overrides``) adds them (see the non-autoregressive task)."""
        return self.score(hypotheses, references, sources)

    def corpus_report(self, split: str, prefix: str, by_id: dict, nll: float, ntokens: int) -> Report | None:
        if not self._decoding():
            return None
        source = self.references_from()
        refs = source.reference_sets(split)
        outputs = [by_id.get(i, ("", None)) for i in range(len(refs))]
        iterations = [n for _, n in outputs if n is not None] or None
        hypotheses, sources = [h for h, _ in outputs], source.datasets[split].src_texts
        report = self.decoding_report(hypotheses, refs, sources, iterations)
        report.examples = [(src, hyp, ref[0] if ref else "") for src, hyp, ref in zip(sources, hypotheses, refs)]
        for name, value in report.metrics.items():
            self.log(f"{prefix}/{name}", value, sync_dist=False)
        return report

    def prepare_source_ids(self, ids: list[list[int]]) -> list[list[int]]:
        """Inputs must fit the model's source positions (with their eos)."""
        max_src = int(getattr(self.model, "max_source_positions", 1024))
        too_long = [i + 1 for i, s in enumerate(ids) if len(s) + 1 > max_src]
        if too_long:
            raise SeqmixError(f"{len(too_long)} source lines are longer than the model's max_source_positions="
                              f"{max_src} tokens (lines {too_long[:5]}...); split or shorten them")
        return ids

    @torch.inference_mode()
    def evaluate_texts(self, sources: list[str], references: list[list[str]] | None, max_tokens: int = 8000,
                       max_sentences: int | None = None, **overrides) -> tuple[list[str], Report | None]:
        """Decode ``sources`` (``overrides``: decoding options such as beam_size) and score them when references
        exist: the best hypothesis of :meth:`decode_outputs`."""
        outputs, report = self.decode_outputs(sources, references, max_tokens, max_sentences, **overrides)
        return [hyps[0].text if hyps else "" for hyps in outputs], report

    @torch.inference_mode()
    def decode_outputs(self, sources: list[str], references: list[list[str]] | None, max_tokens: int = 8000,
                       max_sentences: int | None = None, request: DecodeRequest | None = None,
                       **overrides) -> tuple[list[list[TextHypothesis]], Report | None]:
        """Per source its hypotheses as ``request`` asks (default: the beam's best; ``nbest``, ``sampling``,
        ``prefix_size``), with scores; the corpus report of the best ones when references exist. ``generate.py``
        formats these; the Python API returns them."""
        request = request or DecodeRequest()
        self.check_request(request, references, **overrides)
        decoded = self._decode(sources, references, max_tokens, max_sentences, request, overrides)
        outputs = decoded.nbest or [[TextHypothesis(h)] for h in decoded.hypotheses]
        outputs = [hyps[: request.nbest] for hyps in outputs]
        if references is None:
            return outputs, None
        best = [hyps[0].text if hyps else "" for hyps in outputs]
        norm = self.tokenizer.normalize_reference
        return outputs, self.decoding_report(best, [[norm(r) for r in refs] for refs in references], sources,
                                             decoded.iterations, **overrides)

    def _decode(self, sources: list[str], references: list[list[str]] | None, max_tokens: int,
                max_sentences: int | None, request: DecodeRequest, overrides: dict) -> Decoded:
        translate = self.translator(request, **overrides)
        ids = self.prepare_source_ids(self.tokenizer.encode_batch(sources))
        targets = [[] for _ in ids]
        if request.prefix_size:  # the dataset's targets are what decode_dataset forces the start of
            targets = self.tokenizer.encode_target_batch([refs[0] if refs else "" for refs in references])
        dataset = PairDataset.from_lists(ids, targets, sources, ["" for _ in ids], eos=self.tokenizer.eos)
        device = next(self.model.parameters()).device
        return decode_dataset(dataset, self.tokenizer, translate, max_tokens, device, max_sentences,
                              prefix_size=request.prefix_size, nbest=request.nbest)

    @torch.inference_mode()
    def score_texts(self, sources: list[str], targets: list[str], max_tokens: int = 8000,
                    max_sentences: int | None = None, **overrides) -> ScoredCorpus:
        """Teacher-forced log-probabilities of ``targets`` given ``sources`` (``seqmix.generation.scoring``), each
        sentence's score normalized with the beam search's ``len_penalty`` (``overrides`` as for decoding)."""
        len_penalty = self.beam_options(**overrides).len_penalty
        src_ids = self.prepare_source_ids(self.tokenizer.encode_batch(sources))
        tgt_ids = self.tokenizer.encode_target_batch(targets)
        max_tgt = int(getattr(self.model, "max_target_positions", 1024))
        too_long = [i + 1 for i, t in enumerate(tgt_ids) if len(t) + 1 > max_tgt]
        if too_long:
            raise SeqmixError(f"{len(too_long)} references are longer than the model's max_target_positions="
                              f"{max_tgt} tokens (lines {too_long[:5]}...); they cannot be scored")
        dataset = PairDataset.from_lists(src_ids, tgt_ids, sources, targets, eos=self.tokenizer.eos)
        device = next(self.model.parameters()).device
        model, start, pad = self.model, self.decoder_start, self.tokenizer.pad
        return score_dataset(lambda src, tgt: token_log_probs(model, src, tgt, start, pad), dataset, self.tokenizer,
                             len_penalty, max_tokens, device, max_sentences)
