"""NonAutoregressiveTranslationTask: DisCo / CMLM training (masked-context loss + length loss) and iterative
parallel decoding, on the translation task's data, BLEU and generate.py path.

Loss of a batch (normalised by the number of scored tokens in ``training_step``): label-smoothed NLL of the
scored positions (DisCo: every real token; CMLM: the masked ones) plus the length NLL summed over sentences.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from seqmix.errors import SeqmixError
from seqmix.generation.decode import Translate, nat_translator
from seqmix.generation.nat_decoding import IterativeDecoder
from seqmix.generation.options import BeamOptions, DecodeRequest, NATOptions, overridden, settings_text
from seqmix.metrics import BleuOptions
from seqmix.tasks.base import Report
from seqmix.tasks.losses import label_smoothed_nll_loss
from seqmix.tasks.translation import TranslationTask

# beam_size= (the autoregressive beam) has no meaning here: ignored, and generate.py's settings line says so.
IGNORED_OPTIONS = ("beam_size",)


class NonAutoregressiveTranslationTask(TranslationTask):
    """``nat``: decoding settings (algorithm easy_first | mask_predict, length_beam, max_iterations); the
    generation settings' max_len_a/b bound the candidate lengths."""

    def __init__(self, model: nn.Module, tokenizer, optimizer: Callable, scheduler: Callable | None = None,
                 label_smoothing: float = 0.1, generation: BeamOptions | None = None, bleu: BleuOptions | None = None,
                 eval_decode: bool = True, run_config: dict | None = None, nat: NATOptions | None = None,
                 eval_generation: dict | None = None) -> None:
        super().__init__(model, tokenizer, optimizer, scheduler, label_smoothing, generation, bleu, eval_decode,
                         run_config, eval_generation=eval_generation)
        for name, ours, theirs in (("eos", model.eos, tokenizer.eos), ("pad", model.padding_idx, tokenizer.pad)):
            if ours != theirs:
                raise SeqmixError(f"model {name} id {ours} differs from the tokenizer's {theirs}")
        self.nat = (nat or NATOptions()).for_model(model)  # fails early on settings the model cannot decode with

    # --- training ------------------------------------------------------------------------------
    def dashboard_tokens(self, batch: dict) -> dict[str, Tensor]:
        """The decoder reads the target's positions (partly masked), not the target shifted right."""
        return {"encoder": batch["src_tokens"][0], "decoder": batch["target"][0]}

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
    def nat_options(self, **overrides) -> NATOptions:
        """``task.nat`` with ``overrides`` (algorithm, length_beam, max_iterations), as this model decodes them."""
        given = {k: v for k, v in overrides.items() if k not in IGNORED_OPTIONS}
        return overridden(self.nat, given, "non-autoregressive decoding").for_model(self.model)

    def nat_decoder(self, **overrides) -> IterativeDecoder:
        gen = self.generation  # the task's max_len_a/b also bound the candidate lengths
        return IterativeDecoder(self.nat_options(**overrides), max_len_a=gen.max_len_a, max_len_b=int(gen.max_len_b))

    def translator(self, request: DecodeRequest | None = None, **overrides) -> Translate:
        return nat_translator(self.model, self.nat_decoder(**overrides), self.compile_decoding)

    def check_request(self, request: DecodeRequest, references, **overrides) -> None:
        """One output per source, found in parallel: no n-best list, samples or forced prefix."""
        if not request.plain:
            raise SeqmixError(f"{type(self.model).__name__} decodes iteratively in parallel: nbest=, sampling= and "
                              "prefix_size= need an autoregressive model; drop them")

    def decoding_settings(self, request: DecodeRequest | None = None, **overrides) -> str:
        gen = self.generation
        text = (f"iterative {settings_text(self.nat_options(**overrides))} max_len_a={gen.max_len_a} "
                f"max_len_b={gen.max_len_b}")
        ignored = [k for k in IGNORED_OPTIONS if overrides.get(k) is not None]
        return text + (f" ({', '.join(ignored)} does not apply)" if ignored else "")

    def score_texts(self, sources: list[str], targets: list[str], *args, **kwargs):
        """A parallel decoder gives no left-to-right likelihood of a whole target to score."""
        raise SeqmixError(f"{type(self.model).__name__} is non-autoregressive: it assigns no left-to-right "
                          "log-probability to a reference, so score_reference=true needs an autoregressive model")

    # --- evaluation ----------------------------------------------------------------------------
    def decoding_report(self, hypotheses: list[str], references: list[list[str]], sources: list[str],
                        iterations: list[int] | None = None, **overrides) -> Report:
        report = super().decoding_report(hypotheses, references, sources)
        if iterations:
            avg = sum(iterations) / len(iterations)
            report.headline += f", average iterations: {avg:.2f}"
            report.details.append(f"{self.nat_description(**overrides)}: average iterations {avg:.2f}")
            report.metrics["iterations"] = avg
        return report

    def nat_description(self, **overrides) -> str:
        o = self.nat_options(**overrides)
        return f"{o.algorithm} (max iterations {o.max_iterations}, length beam {o.length_beam})"
