"""``generate.py ckpt_path=[a.ckpt,b.ckpt]``: several checkpoints loaded as one task that decodes with their
ensemble (``seqmix.generation.ensemble``). The first checkpoint's task, tokenizer and decoding settings apply; every
other checkpoint must share its task and its vocabulary, else nothing is decoded."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig

from seqmix.config.build import load_task
from seqmix.errors import SeqmixError
from seqmix.generation.ensemble import Ensemble
from seqmix.tasks import TranslationTask
from seqmix.tasks.nat_translation import NonAutoregressiveTranslationTask


def load_checkpoints(ckpt_path: str | Sequence[str], average_last: int = 0,
                     average_updates: bool = False) -> tuple[object, DictConfig]:
    """(task, training config) of one checkpoint (``load_task``), or of a list of them as an ensemble."""
    if isinstance(ckpt_path, str):
        return load_task(ckpt_path, average_last, average_updates)
    paths = [str(p) for p in ckpt_path]
    if len(paths) == 1:
        return load_task(paths[0], average_last, average_updates)
    if average_last:
        raise SeqmixError("average_last= averages the checkpoints of one run and ckpt_path= lists an ensemble: "
                          "write each run's average first (python -m seqmix.average <run> --last N --out <file>) "
                          "and list those files in ckpt_path=[...]")
    return load_ensemble(paths)


def load_ensemble(paths: Sequence[str]) -> tuple[object, DictConfig]:
    """The first checkpoint's task around an :class:`Ensemble` of every checkpoint's model."""
    first, first_cfg = load_task(paths[0])
    decodable(first, paths[0])
    models = [first.model]
    for path in paths[1:]:
        task, cfg = load_task(path)
        decodable(task, path)
        check_compatible((paths[0], first, first_cfg), (path, task, cfg))
        models.append(task.model)
    first.model = Ensemble(models).eval()
    return first, first_cfg


def decodable(task, path: str) -> None:
    """Ensembles average left-to-right next-token distributions: autoregressive translation models only."""
    if isinstance(task, NonAutoregressiveTranslationTask):
        raise SeqmixError(f"{path} holds a non-autoregressive model ({type(task.model).__name__}), whose iterative "
                          "decoding has no per-step distribution to average: ensemble autoregressive checkpoints")
    if not isinstance(task, TranslationTask):
        raise SeqmixError(f"{path} is a {type(task).__name__} checkpoint; ensembles decode translation and "
                          "summarization models: give one checkpoint")


def check_compatible(first: tuple[str, object, DictConfig], other: tuple[str, object, DictConfig]) -> None:
    """One task, one vocabulary and one decoder start symbol, else a ``SeqmixError`` naming both checkpoints."""
    (path_a, a, cfg_a), (path_b, b, cfg_b) = first, other
    if (type(a), cfg_a.task.name) != (type(b), cfg_b.task.name):
        problem = f"they are trained for different tasks ({cfg_a.task.name} and {cfg_b.task.name})"
    elif a.tokenizer.content_hash() != b.tokenizer.content_hash():
        problem = "their tokenizers/vocabularies differ"
    elif a.decoder_start != b.decoder_start:
        problem = (f"their decoders start with different symbols (model.decoder_start {a.decoder_start} and "
                   f"{b.decoder_start})")
    else:
        return
    raise SeqmixError(f"cannot ensemble {path_a} and {path_b}: {problem}; an ensemble's models must share the task "
                      "and the vocabulary (ensemble runs trained on the same data and tokenizer)")
