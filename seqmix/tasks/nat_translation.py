"""NonAutoregressiveTranslationTask: DisCo / CMLM training (masked-context loss + length loss) and iterative
parallel decoding, on the translation task's data, BLEU and generate.py path.

Loss of a batch (normalised by the number of scored tokens in ``training_step``): label-smoothed NLL of the
scored positions (DisCo: every real token; CMLM: the masked ones) plus the length NLL summed over sentences.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from seqmix.data import PairDataset, TokenBudgetBatchSampler, TranslationDataModule, collate_pairs
from seqmix.errors import SeqmixError
from seqmix.generation.nat_decoding import ALGORITHMS, IterativeDecoder
from seqmix.tasks.base import Report
from seqmix.tasks.losses import label_smoothed_nll_loss
from seqmix.tasks.translation import TranslationTask

NAT_OPTIONS = ("algorithm", "length_beam", "max_iterations")
# generate.yaml always passes beam_size (autoregressive beam); it has no meaning here and is ignored.
IGNORED_OPTIONS = ("beam_size",)


class NonAutoregressiveTranslationTask(TranslationTask):
    """``nat``: decoding settings (algorithm easy_first | mask_predict, length_beam, max_iterations)."""

    def __init__(self, model: nn.Module, tokenizer, optimizer: Callable, scheduler: Callable | None = None,
                 label_smoothing: float = 0.1, generation: dict | None = None, bleu: dict | None = None,
                 eval_decode: bool = True, run_config: dict | None = None, nat: dict | None = None) -> None:
        super().__init__(model, tokenizer, optimizer, scheduler, label_smoothing, generation, bleu, eval_decode,
                         run_config)
        for name, ours, theirs in (("eos", model.eos, tokenizer.eos), ("pad", model.padding_idx, tokenizer.pad)):
            if ours != theirs:
                raise SeqmixError(f"model {name} id {ours} differs from the tokenizer's {theirs}")
        self.nat = {"algorithm": "easy_first" if model.per_query_contexts else "mask_predict",
                    "length_beam": 5, "max_iterations": 10, **dict(nat or {})}
        self.decoder_settings(**self.nat)  # fail early on bad settings
        self.last_iterations: list[int] = []

    @classmethod
    def build_model(cls, cfg: DictConfig, vocab_size: int, padding_idx: int) -> nn.Module:
        """The DisCo / CMLM preset; only on parallel (source, target) data."""
        data = get_class(cfg.task.data._target_)
        if not issubclass(data, TranslationDataModule):
            raise SeqmixError(f"model={cfg.model.name} is a non-autoregressive translation model; task="
                              f"{cfg.task.name} reads {data.__name__}, not parallel data: choose a translation task")
        return super().build_model(cfg, vocab_size, padding_idx)

    @classmethod
    def options_from_config(cls, cfg: DictConfig) -> dict:
        options = super().options_from_config(cfg)
        nat = cfg.task.get("nat")
        options["nat"] = {} if nat is None else OmegaConf.to_container(nat, resolve=True)
        return options

    # --- training ------------------------------------------------------------------------------
    def compute_loss(self, batch: dict) -> tuple[Tensor, Tensor, int]:
        target = batch["target"]
        model = self.model
        observed, scored = model.training_context(target)
        logits, length_logits = model(batch["src_tokens"], target, observed)
        loss, nll, ntokens = label_smoothed_nll_loss(logits[scored], target[scored], self.label_smoothing,
                                                     self.tokenizer.pad)
        length_nll = F.cross_entropy(length_logits.float(), model.length_targets(target), reduction="sum")
        if self._trainer is not None and not self.trainer.sanity_checking:
            self.log(f"{'train' if self.training else 'val'}/length_nll", length_nll.detach() / target.size(0),
                     batch_size=target.size(0))
        return loss + length_nll, nll, ntokens

    # --- decoding ------------------------------------------------------------------------------
    def decoder_settings(self, **overrides) -> IterativeDecoder:
        opts = {**self.nat, **{k: v for k, v in overrides.items() if k not in IGNORED_OPTIONS}}
        unknown = set(opts) - set(NAT_OPTIONS)
        if unknown:
            raise SeqmixError(f"{sorted(unknown)} do not apply to non-autoregressive decoding; its options are "
                              f"{list(NAT_OPTIONS)}")
        if opts["algorithm"] not in ALGORITHMS:
            raise SeqmixError(f"algorithm={opts['algorithm']!r} is unknown; choose one of {list(ALGORITHMS)}")
        if opts["algorithm"] == "easy_first" and not self.model.per_query_contexts:
            raise SeqmixError("parallel easy-first needs per-query contexts (model=disco); decode this "
                              f"{type(self.model).__name__} with algorithm=mask_predict")
        if int(opts["length_beam"]) < 1 or int(opts["max_iterations"]) < 1:
            raise SeqmixError(f"length_beam={opts['length_beam']} and max_iterations={opts['max_iterations']} "
                              "must be >= 1")
        gen = self.generation  # the task's max_len_a/b also bound the candidate lengths
        return IterativeDecoder(opts["algorithm"], int(opts["length_beam"]), int(opts["max_iterations"]),
                                max_len_a=gen.get("max_len_a"), max_len_b=int(gen.get("max_len_b") or 0))

    def translate_with_iterations(self, src_tokens: Tensor, **overrides) -> tuple[list[str], list[int]]:
        result = self.decoder_settings(**overrides).generate(self.model, src_tokens)
        return [self.tokenizer.decode(t.tolist()) for t in result.tokens], result.iterations.tolist()

    def translate(self, src_tokens: Tensor, **overrides) -> list[str]:
        return self.translate_with_iterations(src_tokens, **overrides)[0]

    # --- evaluation ----------------------------------------------------------------------------
    def eval_outputs(self, batch: dict) -> list:
        if not self._decoding():
            return []
        hyps, iterations = self.translate_with_iterations(batch["src_tokens"])
        return list(zip(hyps, iterations))

    def corpus_report(self, split: str, prefix: str, by_id: dict, nll: float, ntokens: int) -> Report | None:
        if not self._decoding():
            return None
        source = self.references_from()
        refs = source.reference_sets(split)
        outputs = [by_id.get(i, ("", 0)) for i in range(len(refs))]
        report = self.score([h for h, _ in outputs], refs, source.datasets[split].src_texts,
                            [n for _, n in outputs])
        for name, value in report.metrics.items():
            self.log(f"{prefix}/{name}", value, sync_dist=False)
        return report

    def score(self, hypotheses: list[str], references: list[list[str]], sources: list[str],
              iterations: list[int] | None = None) -> Report:
        report = super().score(hypotheses, references, sources)
        if iterations:
            avg = sum(iterations) / len(iterations)
            report.headline += f", average iterations: {avg:.2f}"
            report.details.append(f"{self.nat_description()}: average iterations {avg:.2f}")
            report.metrics["iterations"] = avg
        return report

    def nat_description(self, **overrides) -> str:
        d = self.decoder_settings(**overrides)
        return f"{d.algorithm} (max iterations {d.max_iterations}, length beam {d.length_beam})"

    @torch.inference_mode()
    def evaluate_texts(self, sources: list[str], references: list[list[str]] | None, max_tokens: int = 8000,
                       max_sentences: int | None = None, **overrides) -> tuple[list[str], Report | None]:
        """Decode ``sources`` in token-budget batches (``overrides``: NAT_OPTIONS) and score them."""
        decoder = self.decoder_settings(**overrides)
        ids = self.prepare_source_ids(self.tokenizer.encode_batch(sources))
        dataset = PairDataset.from_lists(ids, [[] for _ in ids], sources, ["" for _ in ids])
        device = next(self.model.parameters()).device
        sampler = TokenBudgetBatchSampler(dataset.src_sizes, dataset.src_sizes, max_tokens=max_tokens,
                                          max_sentences=max_sentences, shuffle=False)
        tok = self.tokenizer
        hyps, iterations = [""] * len(ids), [0] * len(ids)
        for batch_idx in sampler:
            batch = collate_pairs([dataset[i] for i in batch_idx], tok.pad, tok.bos, tok.eos)
            result = decoder.generate(self.model, batch["src_tokens"].to(device))
            for i, t, n in zip(batch["id"].tolist(), result.tokens, result.iterations.tolist()):
                hyps[i], iterations[i] = tok.decode(t.tolist()), n
        self.last_iterations = iterations
        if references is None:
            return hyps, None
        norm = tok.normalize_reference
        return hyps, self.score(hyps, [[norm(r) for r in refs] for refs in references], sources, iterations)
