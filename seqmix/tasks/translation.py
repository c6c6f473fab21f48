"""TranslationTask: label-smoothed training, validation loss + BLEU by beam search, test BLEU."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from seqmix.data import PairDataset
from seqmix.errors import SeqmixError
from seqmix.generation import BeamSearch
from seqmix.generation.decode import decode_dataset
from seqmix.metrics import corpus_bleu
from seqmix.tasks.base import Report, SeqmixTask
from seqmix.tasks.losses import label_smoothed_nll_loss

BEAM_OPTIONS = ("beam_size", "len_penalty", "max_len_a", "max_len_b", "min_len_a", "min_len_b",
                "no_repeat_ngram_size", "stepwise_len_penalty")


class TranslationTask(SeqmixTask):
    """Wraps an encoder-decoder model; owns loss, decoding and BLEU."""

    def __init__(self, model: nn.Module, tokenizer, optimizer: Callable, scheduler: Callable | None = None,
                 label_smoothing: float = 0.1, generation: dict | None = None, bleu: dict | None = None,
                 eval_decode: bool = True, run_config: dict | None = None) -> None:
        super().__init__(model, tokenizer, optimizer, scheduler, run_config)
        self.label_smoothing = label_smoothing
        self.generation = dict(generation or {})
        self.bleu_options = dict(bleu or {})
        self.eval_decode = eval_decode  # decode and score at every validation too (the final test always does)

    @classmethod
    def build_model(cls, cfg: DictConfig, vocab_size: int, padding_idx: int) -> nn.Module:
        """The model preset as configured; source and target share one (joint) vocabulary."""
        return instantiate(cfg.model, src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, padding_idx=padding_idx)

    @classmethod
    def options_from_config(cls, cfg: DictConfig) -> dict:
        def plain(key):
            value = cfg.task.get(key)
            return {} if value is None else OmegaConf.to_container(value, resolve=True)

        return {"label_smoothing": cfg.label_smoothing, "generation": plain("generation"), "bleu": plain("bleu")}

    # --- training ------------------------------------------------------------------------------
    def compute_loss(self, batch: dict) -> tuple[Tensor, Tensor, int]:
        logits = self.model(batch["src_tokens"], batch["prev_output_tokens"])
        return label_smoothed_nll_loss(logits, batch["target"], self.label_smoothing, self.tokenizer.pad)

    # --- decoding ------------------------------------------------------------------------------
    def beam_search(self, **overrides) -> BeamSearch:
        opts = {**self.generation, **overrides}
        tok = self.tokenizer
        return BeamSearch(bos=tok.bos, eos=tok.eos, pad=tok.pad, unk=tok.unk,
                          max_target_positions=getattr(self.model, "max_target_positions", None), **opts)

    def translate(self, src_tokens: Tensor, **overrides) -> list[str]:
        """Best hypothesis of each source row, detokenized."""
        hyps = self.beam_search(**overrides).generate(self.model, src_tokens)
        return [self.tokenizer.decode(h[0].tokens.tolist()) if h else "" for h in hyps]

    # --- evaluation ----------------------------------------------------------------------------
    def _decoding(self) -> bool:
        return self.eval_decode or self.trainer.testing

    def eval_outputs(self, batch: dict) -> list:
        return self.translate(batch["src_tokens"]) if self._decoding() else []

    def score(self, hypotheses: list[str], references: list[list[str]], sources: list[str]) -> Report:
        """Corpus BLEU against the first reference of each example (translation data has one)."""
        result = corpus_bleu(hypotheses, [refs[0] for refs in references], **self.bleu_options)
        return Report(result.score, f"BLEU: {result.score:.2f}", [f"sacreBLEU: {result}"],
                      metrics={"bleu": result.score})

    def corpus_report(self, split: str, prefix: str, by_id: dict, nll: float, ntokens: int) -> Report | None:
        if not self._decoding():
            return None
        source = self.references_from()
        refs = source.reference_sets(split)
        report = self.score([by_id.get(i, "") for i in range(len(refs))], refs, source.datasets[split].src_texts)
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
        """Decode ``sources`` (``overrides``: beam options such as beam_size) and score them when references exist."""
        unknown = set(overrides) - set(BEAM_OPTIONS)
        if unknown:
            raise SeqmixError(f"{sorted(unknown)} do not apply to {type(self).__name__}; beam options are "
                              f"{list(BEAM_OPTIONS)}")
        ids = self.prepare_source_ids(self.tokenizer.encode_batch(sources))
        dataset = PairDataset.from_lists(ids, [[] for _ in ids], sources, ["" for _ in ids])
        device = next(self.model.parameters()).device
        hyps, _ = decode_dataset(self.model, self.tokenizer, dataset, self.beam_search(**overrides), max_tokens, device,
                                 max_sentences)
        if references is None:
            return hyps, None
        norm = self.tokenizer.normalize_reference
        return hyps, self.score(hyps, [[norm(r) for r in refs] for refs in references], sources)
