"""The Python face of a trained model: one object around the task a checkpoint rebuilds, whose methods call the
task's own decoding and scoring (the path ``generate.py`` takes), so a notebook and the command give the same
outputs."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import torch

from seqmix.average import checkpoints_to_average
from seqmix.config.build import task_from_checkpoint
from seqmix.config.ensemble import load_checkpoints
from seqmix.errors import SeqmixError
from seqmix.generation.options import DecodeRequest, SamplingOptions
from seqmix.generation.scoring import ScoredCorpus
from seqmix.models.quantized import check_quantize, quantize_int8
from seqmix.tasks import LanguageModelingTask, SummarizationTask, TranslationTask
from seqmix.training.checkpoints import average_checkpoints

PathLike = str | os.PathLike


def load(checkpoint: PathLike | list[PathLike] | None = None, *, average: list[PathLike] | None = None,
         average_last: int = 0, average_updates: bool = False, device: str | torch.device = "cpu") -> Model:
    """A seqmix checkpoint (``best.ckpt``, an averaged or a fairseq-imported one; a folder: a fairseq model, see
    :func:`load_fairseq`), an ensemble of a list of them
    (as ``generate.py ckpt_path=[a,b]``), the mean of the checkpoint files in ``average``, or of the latest
    ``average_last`` epoch (``average_updates``: interval) checkpoints beside ``checkpoint``; in eval mode on
    ``device``."""
    if (checkpoint is None) == (average is None):
        raise SeqmixError("seqmix.load: give a checkpoint, or average=[checkpoint files] (not both)")
    if average is not None:
        paths = checkpoints_to_average([str(p) for p in average], None)
        task, config = task_from_checkpoint(average_checkpoints(paths), f"average of {', '.join(map(str, paths))}")
    elif not isinstance(checkpoint, list | tuple) and Path(checkpoint).is_dir():
        return load_fairseq(Path(checkpoint) / "checkpoint.pt", device=device)
    else:
        listed = [str(p) for p in checkpoint] if isinstance(checkpoint, list | tuple) else [str(checkpoint)]
        for path in listed:
            if not Path(path).is_file():
                raise SeqmixError(f"seqmix.load: checkpoint {path} does not exist")
        task, config = load_checkpoints(listed if len(listed) > 1 else listed[0], average_last, average_updates)
    return Model(task, config).to(device)


def load_fairseq(checkpoint: PathLike, data_dir: PathLike | None = None, *, source_lang: str | None = None,
                 target_lang: str | None = None, bpe_codes: PathLike | None = None, moses: bool = True,
                 device: str | torch.device = "cpu") -> Model:
    """A fairseq checkpoint with its dictionaries in ``data_dir`` (default: the checkpoint's folder, as a seqmix
    export writes it), imported as ``python -m seqmix.interop.fairseq import`` does; ``seqmix.load(folder)`` calls
    this for a folder holding ``checkpoint.pt``."""
    from seqmix.interop.fairseq import import_checkpoint

    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise SeqmixError(f"seqmix.load: fairseq checkpoint {checkpoint} does not exist")
    with tempfile.TemporaryDirectory(prefix="seqmix-import-") as folder:
        imported = Path(folder) / "imported.ckpt"
        import_checkpoint(checkpoint, data_dir if data_dir is not None else checkpoint.parent, imported,
                          source_lang, target_lang, None if bpe_codes is None else str(bpe_codes), moses)
        task, config = load_checkpoints(str(imported), 0, False)
    return Model(task, config).to(device)


class Model:
    """A trained model: ``translate`` / ``summarize`` (sequence-to-sequence), ``perplexity`` (language models),
    ``sample`` (both: sampled translations, or continuations of prompts), ``score``. Inputs are plain text; batches
    are formed by tokens inside (``max_tokens``); decoding options default to the checkpoint's task settings
    (``model.settings()`` says them) and any of them can be given per call.

    Outputs are strings, one per input; with ``nbest > 1`` or ``with_scores=True`` each input gets a list of
    :class:`~seqmix.generation.decode.TextHypothesis` (``text``, ``score``, ``positional_scores``), best first."""

    def __init__(self, task, config) -> None:
        self.task = task
        self.config = config

    @property
    def name(self) -> str:
        return f"{self.config.model.name} ({self.config.task.name})"

    @property
    def tokenizer(self):
        return self.task.tokenizer

    @property
    def device(self) -> torch.device:
        return next(self.task.model.parameters()).device

    def to(self, *args, **kwargs) -> Model:
        """A device and/or dtype, as ``nn.Module.to``."""
        self.task.to(*args, **kwargs)
        return self

    def half(self) -> Model:
        self.task.half()
        return self

    def quantize(self, kind: str = "int8") -> Model:
        """Decode with the Linear layers in dynamic int8 (CPU only), as ``generate.py quantize=int8``: faster on CPU
        at a small BLEU cost (benchmarks/README.md, serving)."""
        check_quantize(kind, self.device)
        self.task.model = quantize_int8(self.task.model)
        return self

    def settings(self, **options) -> str:
        """What decoding runs with under ``options`` (the rest from the checkpoint's task)."""
        return self.task.decoding_settings(**options)

    def translate(self, sentences: list[str] | str, max_tokens: int = 8000, nbest: int = 1,
                  with_scores: bool = False, **options):
        """Translations of ``sentences`` (a string gives a string) with the checkpoint's decoding settings, any of
        them overridden by ``options`` (beam_size, len_penalty, max_len_a, max_len_b, ...); ``nbest`` > 1 or
        ``with_scores``: the beam's ``nbest`` best hypotheses of each, with scores (see the class)."""
        self._require(TranslationTask, "translate", "it is a language model: use perplexity() or sample()")
        return self._decode(sentences, max_tokens, options, DecodeRequest(nbest), with_scores)

    def sample(self, inputs: list[str] | str, top_k: int = 0, top_p: float = 1.0, temperature: float = 1.0,
               seed: int | None = None, nbest: int = 1, with_scores: bool = False, max_tokens: int = 8000,
               **options):
        """Sampled outputs: translations (summaries) of sources, or a language model's continuations of prompts;
        ``nbest`` independent samples each. The draw is cut to ``top_k`` tokens (0: no cut) and to probability
        ``top_p`` at ``temperature``; ``seed`` repeats it for the same inputs and ``max_tokens``. ``options``: length
        bounds and bans (max_len_b, min_len_b, no_repeat_ngram_size, len_penalty for the score)."""
        request = DecodeRequest(nbest, SamplingOptions(top_k, top_p, temperature, seed))
        return self._decode(inputs, max_tokens, options, request, with_scores)

    def summarize(self, documents: list[str] | str, max_tokens: int = 8000, **options) -> list[str] | str:
        """Summaries of ``documents``, truncated as in training, with the task's length bounds and options."""
        self._require(SummarizationTask, "summarize", "it is not a summarization model: use translate()")
        return self._decode(documents, max_tokens, options)

    def perplexity(self, texts: list[str] | str, max_tokens: int = 8000, eval_context: int | None = None) -> float:
        """Perplexity of ``texts`` (each line followed by ``</s>``) with the training block settings, as
        ``generate.py`` reports it for a language model."""
        self._require(LanguageModelingTask, "perplexity", "it is not a language model")
        _, report = self.task.evaluate_texts(_as_list(texts), None, max_tokens, eval_context=eval_context)
        return report.metrics["perplexity"]

    def score(self, sources: list[str] | str, targets: list[str] | str | None = None, max_tokens: int = 8000,
              **options) -> ScoredCorpus:
        """Teacher-forced log-probabilities: of each target given its source (sequence-to-sequence), or of each text
        (language models: ``score(texts)``). Per sentence the per-token log-probs (``</s>`` included) and the total
        normalized as beam search scores (``len_penalty`` from the checkpoint or ``options``), so a hypothesis gets
        its beam score back; the corpus's summed log-prob, token count and perplexity."""
        if isinstance(self.task, LanguageModelingTask):
            if targets is not None:
                raise SeqmixError(f"{self.name} is a language model: score(texts) takes the texts alone")
            return self.task.score_texts(_as_list(sources), None, max_tokens)
        if targets is None:
            raise SeqmixError(f"{self.name} scores targets given sources: score(sources, targets)")
        sources, targets = _as_list(sources), _as_list(targets)
        if len(sources) != len(targets):
            raise SeqmixError(f"score(): {len(sources)} sources but {len(targets)} targets; give one target each")
        with torch.inference_mode():
            return self.task.score_texts(sources, targets, max_tokens, **options)

    def _decode(self, texts: list[str] | str, max_tokens: int, options: dict, request: DecodeRequest | None = None,
                with_scores: bool = False):
        """The task's ``decode_outputs`` (what generate.py writes), as strings or hypothesis lists."""
        given = _as_list(texts)
        if not all(isinstance(t, str) for t in given):
            raise SeqmixError("give the inputs as a string or a list of strings")
        with torch.inference_mode():
            outputs, _ = self.task.decode_outputs(given, None, max_tokens, request=request, **options)
        if outputs is None:
            raise SeqmixError(f"{self.name} gives no outputs for these options: use perplexity() to score texts")
        if not (with_scores or (request is not None and request.nbest > 1)):
            outputs = [hyps[0].text if hyps else "" for hyps in outputs]
        return outputs[0] if isinstance(texts, str) else outputs

    def _require(self, kind: type, method: str, otherwise: str) -> None:
        if not isinstance(self.task, kind):
            raise SeqmixError(f"{method}() does not apply to {self.name}: {otherwise}")

    def __repr__(self) -> str:
        return f"seqmix.Model({self.name}, {self.device})"


def _as_list(texts: list[str] | str) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)
