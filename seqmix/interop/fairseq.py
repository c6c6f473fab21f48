"""fairseq checkpoints in and out: ``python -m seqmix.interop.fairseq import|export ...``.

import: a fairseq ``checkpoint.pt`` (``args`` Namespace of fairseq ≤0.9, or ``cfg`` of later releases, whose
``model`` node is a Namespace, dict or DictConfig) plus the ``dict.<lang>.txt`` files it was trained with (and its
BPE codes) become a seqmix checkpoint that ``generate.py`` and ``seqmix.training.checkpoints.load_task`` read: the model
config from the checkpoint's settings (completed from the registered architecture's defaults), every tensor
renamed and reshaped by the family's table (``seqmix.interop.fairseq_models``), the tokenizer from the
dictionaries. Anything that does not map is refused with one message and nothing is written.

export: a seqmix checkpoint of a transformer, lightconv/dynamicconv or ConvS2S model becomes ``checkpoint.pt``
(an ``args``-style container with the registered architecture and every setting explicit) with
``dict.<src>.txt``/``dict.<tgt>.txt`` and ``seqmix_tokenizer.json`` (the exact tokenizer, used again on re-import);
a language model becomes a ``transformer_lm`` / ``lightconv_lm`` / ``talkconv_lm`` ``checkpoint.pt`` with ``dict.txt``.

A language model (``transformer_lm*``, ``lightconv_lm*``, the official TaLK code's ``talkconv_lm*``) imports with the
``dict.txt`` beside it (``--data-dir``; ``--no-moses`` for text already tokenized, as WikiText) into a
language-modeling checkpoint;
in Python, ``language_model_from_fairseq(read_fairseq(path))`` gives the DecoderOnly and its configs.
"""

from __future__ import annotations

import io
import logging
import pickle
import sys
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from seqmix.config.paths import conf_dir
from seqmix.config.user_errors import CommandParser, command_status
from seqmix.errors import SeqmixError
from seqmix.files import atomic_write, atomic_write_text
from seqmix.interop.fairseq_archs import complete_settings, family_of
from seqmix.interop.fairseq_models import (
    FAMILIES,
    LANGUAGE_MODELS,
    PADDING_IDX,
    Family,
    family_for_seqmix,
    to_fairseq_state,
    to_seqmix_state,
)
from seqmix.training.checkpoints import load_checkpoint

log = logging.getLogger("seqmix")

TOKENIZER_FILE = "seqmix_tokenizer.json"
# fairseq-generate's defaults (beam 5, --lenpen 1, max length 200 whatever the source length)
FAIRSEQ_GENERATION = {"beam_size": 5, "len_penalty": 1.0, "max_len_a": 0.0, "max_len_b": 200, "min_len_a": 0.0,
                      "min_len_b": 1, "no_repeat_ngram_size": 0}
# fairseq's generation options (``args``, or ``cfg.generation``) → seqmix's; ``min_len`` is a constant there
GENERATION_NAMES = {"beam": "beam_size", "lenpen": "len_penalty", "max_len_a": "max_len_a", "max_len_b": "max_len_b",
                    "min_len": "min_len_b", "no_repeat_ngram_size": "no_repeat_ngram_size"}


# --- reading fairseq's container ----------------------------------------------------------------------------------
@dataclass
class FairseqCheckpoint:
    arch: str
    family: Family
    settings: dict  # complete flat fairseq model settings
    state: dict  # the model's tensors as saved
    source_lang: str | None = None
    target_lang: str | None = None
    generation: dict | None = None  # seqmix's decoding settings from the checkpoint's generation options


def _generation(options: dict) -> dict:
    """fairseq-generate's defaults, overridden by the generation options a checkpoint holds (a seqmix export writes
    its task's; fairseq's own ``cfg.generation`` holds the training command's, usually the defaults)."""
    found = {ours: options[theirs] for theirs, ours in GENERATION_NAMES.items()
             if isinstance(options.get(theirs), (int, float)) and not isinstance(options.get(theirs), bool)}
    return {**FAIRSEQ_GENERATION, **found}


def _plain(node) -> dict:
    """A Namespace, dict or DictConfig of settings as a plain dict."""
    if node is None:
        return {}
    if isinstance(node, Namespace):
        return dict(vars(node))
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    if isinstance(node, dict):
        return dict(node)
    raise SeqmixError(f"cannot read fairseq settings of type {type(node).__name__}")


def _flatten(settings: dict) -> dict:
    """Dataclass-style nested settings (``encoder: {embed_dim: ...}``) in fairseq's flat argparse names
    (``encoder_embed_dim``), which the legacy architectures and this importer use."""
    flat = {}
    for key, value in settings.items():
        if key in ("encoder", "decoder", "quant_noise") and isinstance(value, dict):
            for inner, v in value.items():
                flat.setdefault(f"{key}_{inner}", v)
        else:
            flat[key] = value
    return flat


def _stand_in(module: str, name: str) -> type:
    """A class for a pickled fairseq object (fairseq itself is not installed): an enum member pickled as
    ``Class(value)`` becomes its value; other objects keep their pickled attributes."""
    def new(cls, *args, **kwargs):
        return args[0] if len(args) == 1 and not kwargs else object.__new__(cls)

    def setstate(self, state) -> None:
        self.__dict__.update(state if isinstance(state, dict) else {"state": state})

    return type(name, (), {"__new__": new, "__setstate__": setstate, "__module__": module})


class _FairseqUnpickler(pickle.Unpickler):
    """v0.10 checkpoints pickle omegaconf configs that name fairseq's config dataclasses and enums; the settings
    themselves are plain values, so stand-ins for fairseq's classes are enough to read them."""

    def find_class(self, module: str, name: str):
        try:
            return super().find_class(module, name)
        except (ModuleNotFoundError, AttributeError):
            if module == "fairseq" or module.startswith("fairseq."):
                return _stand_in(module, name)
            raise


class _pickle_module:  # what torch.load's ``pickle_module`` needs
    Unpickler = _FairseqUnpickler
    load = staticmethod(pickle.load)


def read_fairseq(path: str | Path) -> FairseqCheckpoint:
    path = Path(path)
    if not path.is_file():
        raise SeqmixError(f"fairseq checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False, pickle_module=_pickle_module)
    except ModuleNotFoundError as err:
        raise SeqmixError(f"{path} pickles objects of a module seqmix does not have ({err}); load it in fairseq and "
                          "re-save it with cfg/args as plain data") from None
    except Exception as err:  # truncated or not a torch file
        raise SeqmixError(f"{path} is not a readable fairseq checkpoint ({type(err).__name__}: {err})") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("model"), dict):
        raise SeqmixError(f"{path} is not a fairseq checkpoint (no 'model' state dict inside)")
    if ckpt.get("args") is not None:
        settings = task = generation = _plain(ckpt["args"])
    elif ckpt.get("cfg") is not None:
        cfg = _plain(ckpt["cfg"])
        settings, task, generation = _plain(cfg.get("model")), _plain(cfg.get("task")), _plain(cfg.get("generation"))
    else:
        raise SeqmixError(f"{path} holds neither 'args' nor 'cfg': its model settings are unknown")
    settings = _flatten(settings)
    arch = settings.get("arch") or settings.get("_name")
    if not arch:
        raise SeqmixError(f"{path}: its settings name no architecture (no 'arch' or '_name')")
    family = FAMILIES[family_of(arch)]
    if family.name in LANGUAGE_MODELS and settings.get("max_target_positions") is None:  # fairseq's build_model
        settings["max_target_positions"] = task.get("max_target_positions") or task.get("tokens_per_sample") or 1024
    return FairseqCheckpoint(arch, family, complete_settings(arch, settings), ckpt["model"],
                             task.get("source_lang"), task.get("target_lang"), _generation(generation))


# --- the seqmix side ----------------------------------------------------------------------------------------------
def _conf(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(conf_dir() / f"{name}.yaml"), resolve=True)


def run_config(model: dict, source_lang: str, target_lang: str, data_dir: str, vocab_size: int,
               generation: dict | None = None) -> dict:
    """A training config as a seqmix checkpoint stores it: the model, a translation task whose data source reads
    ``<data_dir>/{split}.{lang}`` (for ``generate.py split=...``), the checkpoint's decoding settings (else
    fairseq-generate's defaults), and the default optimizer/schedule (for fine-tuning with ``init_from=``)."""
    return _with_training_defaults(model, {
        "name": f"fairseq_{source_lang}_{target_lang}", "src_lang": source_lang, "tgt_lang": target_lang,
        "vocab_size": vocab_size,
        "module": {"_target_": "seqmix.tasks.TranslationTask", "_partial_": True},
        "data": {"_target_": "seqmix.data.TranslationDataModule",
                 "source": {"_target_": "seqmix.data.LocalParallelSource", "path": str(data_dir),
                            "src_lang": source_lang, "tgt_lang": target_lang, "pattern": "{split}.{lang}"},
                 "src_lang": source_lang, "tgt_lang": target_lang,
                 "splits": {"train": "train", "valid": "valid", "test": "test"}, "max_tokens": 4096,
                 "max_source_positions": model["max_source_positions"],
                 "max_target_positions": model["max_target_positions"]},
        "generation": dict(generation or FAIRSEQ_GENERATION),
        "bleu": {"tokenize": "13a", "lowercase": False},
    })


def _with_training_defaults(model: dict, task: dict) -> dict:
    """A run config around ``model`` and ``task``: the default optimizer/schedule (for fine-tuning with
    ``init_from=``) and training settings."""
    return {"seed": 1, "label_smoothing": 0.1, "fused_loss": True, "compile": False, "nonfinite": "raise",
            "nonfinite_skip_limit": 10, "optim": _conf("optim/adam"), "scheduler": _conf("scheduler/inverse_sqrt"),
            "model": model, "task": task}


def language_model_run_config(model: dict, adaptive: dict, data_dir: str, vocab_size: int) -> dict:
    """A language-modeling run config as a seqmix checkpoint stores it: the model, ``task.adaptive``, blocks of the
    model's positions (fairseq's tokens_per_sample), a data source reading ``<data_dir>/{split}.txt``."""
    positions = int(model["max_target_positions"])
    return _with_training_defaults(model, {
        "name": "fairseq_lm", "vocab_size": vocab_size,
        "module": {"_target_": "seqmix.tasks.LanguageModelingTask", "_partial_": True},
        "monitor": {"metric": "val/ppl", "mode": "min"}, "adaptive": adaptive,
        "data": {"_target_": "seqmix.data.LanguageModelingDataModule",
                 "source": {"_target_": "seqmix.data.LocalTextSource", "path": str(data_dir), "pattern": "{split}.txt"},
                 "splits": {"train": "train", "valid": "valid", "test": "test"}, "tokens_per_sample": positions,
                 "break_mode": "none", "eval_context": 0, "max_tokens": 4096, "max_positions": positions},
    })


def save_seqmix_checkpoint(path: str | Path, task, extra: dict | None = None) -> None:
    """What ``load_task`` reads (weights under ``model.``, the run config, the tokenizer), written atomically."""
    ckpt = {"state_dict": {f"model.{k}": v for k, v in task.model.state_dict().items()},
            "seqmix": task.checkpoint_meta(),
            **(extra or {})}
    atomic_write(Path(path), lambda f: torch.save(ckpt, f))


def _dictionary_tokenizer(data_dir: Path, source_lang: str, target_lang: str, bpe_codes: str | None,
                          moses: bool):
    from seqmix.data.fairseq_dictionary import FairseqDictionary
    from seqmix.data.moses_subword import MosesSubwordTokenizer

    dicts = []
    for lang in (source_lang, target_lang):
        path = data_dir / f"dict.{lang}.txt"
        if not path.is_file():
            raise SeqmixError(f"{path} does not exist: --data-dir must hold the dict.<lang>.txt files the model was "
                              "trained with (and --source-lang/--target-lang name them)")
        dicts.append(FairseqDictionary.load(path))
    codes = None
    if bpe_codes is not None:
        try:
            codes = Path(bpe_codes).read_text(encoding="utf-8")
        except OSError as err:
            raise SeqmixError(f"cannot read the BPE codes {bpe_codes} ({err})") from None
    return MosesSubwordTokenizer(dicts[0], dicts[1], source_lang, target_lang, bpe_codes=codes, moses=moses)


def import_tokenizer(data_dir: Path, source_lang: str, target_lang: str, bpe_codes: str | None, moses: bool):
    """The exact tokenizer of a seqmix export (``seqmix_tokenizer.json`` beside the dictionaries) unless BPE codes
    are given; otherwise Moses + subword-nmt over the fairseq dictionaries."""
    from seqmix.data import Tokenizer

    saved = data_dir / TOKENIZER_FILE
    if bpe_codes is None and saved.is_file():
        return Tokenizer.from_json(saved.read_text(encoding="utf-8"))
    return _dictionary_tokenizer(data_dir, source_lang, target_lang, bpe_codes, moses)


def build_imported_task(fs: FairseqCheckpoint, tokenizer, data_dir: Path, source_lang: str, target_lang: str):
    """The seqmix task (model + tokenizer + config) holding the fairseq checkpoint's weights, or one SeqmixError."""
    from seqmix.config.build import build_task

    model_cfg = fs.family.seqmix_config(fs.arch, fs.settings)
    vocab_rows = {"source": fs.state.get("encoder.embed_tokens.weight"),
                  "target": fs.state.get("decoder.embed_tokens.weight")}
    sizes = {"source": tokenizer.source_vocab_size, "target": tokenizer.target_vocab_size}
    for side, rows in vocab_rows.items():
        lang = source_lang if side == "source" else target_lang
        if rows is not None and rows.shape[0] != sizes[side]:
            raise SeqmixError(f"the {side} dictionary (dict.{lang}.txt) has {sizes[side]} symbols but the checkpoint's "
                              f"{side} embeddings have {rows.shape[0]} rows: use the dictionaries it was trained with")
    dicts = getattr(tokenizer, "source_dict", None), getattr(tokenizer, "target_dict", None)
    if model_cfg.get("share_all_embeddings") and dicts[0] is not None and dicts[0] != dicts[1]:
        raise SeqmixError(f"the checkpoint shares one embedding table between source and target "
                          f"(share_all_embeddings), which fairseq trains with one joined dictionary, but "
                          f"dict.{source_lang}.txt and dict.{target_lang}.txt differ: give --data-dir the dictionaries "
                          "it was trained with")
    cfg = run_config(model_cfg, source_lang, target_lang, str(data_dir), tokenizer.target_vocab_size, fs.generation)
    task = build_task(OmegaConf.create(cfg), tokenizer)
    state = to_seqmix_state(fs.family, fs.settings, fs.state, task.model.state_dict())
    task.model.load_state_dict(state, strict=True)
    task.eval()
    return task


def import_checkpoint(checkpoint: str | Path, data_dir: str | Path, out: str | Path, source_lang: str | None = None,
                      target_lang: str | None = None, bpe_codes: str | None = None, moses: bool = True):
    """fairseq ``checkpoint`` → seqmix checkpoint ``out``; returns the task."""
    fs = read_fairseq(checkpoint)
    if fs.family.name in LANGUAGE_MODELS:
        return import_language_model(fs, checkpoint, Path(data_dir), out, bpe_codes, moses)
    source_lang, target_lang = source_lang or fs.source_lang, target_lang or fs.target_lang
    if not source_lang or not target_lang:
        raise SeqmixError("the checkpoint does not say its languages: pass --source-lang and --target-lang")
    data_dir = Path(data_dir)
    tokenizer = import_tokenizer(data_dir, source_lang, target_lang, bpe_codes, moses)
    task = build_imported_task(fs, tokenizer, data_dir, source_lang, target_lang)
    save_seqmix_checkpoint(out, task, {"fairseq": {"arch": fs.arch, "source": str(checkpoint)}})
    return task


# --- language models (library level) -------------------------------------------------------------------------------
def _language_model_vocab(state: dict) -> int:
    """The vocabulary size of a fairseq language model's state: its input table's rows (all bands)."""
    bands = [v for k, v in state.items() if k.startswith("decoder.embed_tokens.embeddings.") and k.endswith(".0.weight")]
    table = state.get("decoder.embed_tokens.weight")
    if table is None and not bands:
        raise SeqmixError("the fairseq language model has no decoder.embed_tokens: it is not a transformer_lm or "
                          "lightconv_lm state dict")
    return int(table.shape[0]) if table is not None else sum(int(b.shape[0]) for b in bands)


def language_model_config(model: dict, adaptive: dict) -> DictConfig:
    """The part of a run config ``seqmix.config.build.build_model`` reads for a language model."""
    return OmegaConf.create({"model": model, "task": {"module": {"_target_": "seqmix.tasks.LanguageModelingTask",
                                                                 "_partial_": True}, "adaptive": adaptive}})


def language_model_from_fairseq(fs: FairseqCheckpoint):
    """A fairseq ``transformer_lm*`` / ``lightconv_lm*`` checkpoint (``read_fairseq``) as seqmix's DecoderOnly in eval
    mode, with the ``model`` and ``task.adaptive`` configs it was built from: ``(model, model_config, adaptive)``."""
    from seqmix.config.build import build_model

    if fs.family.name not in LANGUAGE_MODELS:
        raise SeqmixError(f"fairseq architecture {fs.arch} is a translation model: use import_checkpoint")
    vocab = _language_model_vocab(fs.state)
    settings = fs.family.settled(fs.settings, vocab)
    model_cfg, adaptive = fs.family.seqmix_config(fs.arch, settings), fs.family.adaptive_config(settings)
    model = build_model(language_model_config(model_cfg, adaptive), vocab, PADDING_IDX)
    model.load_state_dict(to_seqmix_state(fs.family, settings, fs.state, model.state_dict()), strict=True)
    return model.eval(), model_cfg, adaptive


def import_language_model(fs: FairseqCheckpoint, checkpoint, data_dir: Path, out, bpe_codes: str | None = None,
                          moses: bool = True):
    """A fairseq language model → seqmix checkpoint ``out`` (a language-modeling task: ``generate.py`` reports
    perplexity): its tokenizer from ``seqmix_tokenizer.json`` or ``dict.txt`` (+ BPE codes, Moses when asked: a
    word-level model's text is split on spaces only)."""
    from seqmix.config.build import build_task
    from seqmix.data import Tokenizer

    model, model_cfg, adaptive = language_model_from_fairseq(fs)
    saved = data_dir / TOKENIZER_FILE
    if bpe_codes is None and saved.is_file():
        tokenizer = Tokenizer.from_json(saved.read_text(encoding="utf-8"))
    else:
        from seqmix.data.fairseq_dictionary import FairseqDictionary
        from seqmix.data.moses_subword import MosesSubwordTokenizer

        path = data_dir / "dict.txt"
        if not path.is_file():
            raise SeqmixError(f"{path} does not exist: --data-dir must hold the dict.txt the language model was "
                              "trained with")
        dictionary = FairseqDictionary.load(path)
        codes = None if bpe_codes is None else Path(bpe_codes).read_text(encoding="utf-8")
        tokenizer = MosesSubwordTokenizer(dictionary, dictionary, "txt", "txt", bpe_codes=codes, moses=moses)
    rows = model.decoder.embed_tokens.num_embeddings
    if tokenizer.vocab_size != rows:
        raise SeqmixError(f"the dictionary has {tokenizer.vocab_size} symbols but the language model's embeddings "
                          f"have {rows} rows: use the dict.txt it was trained with")
    cfg = language_model_run_config(model_cfg, adaptive, str(data_dir), tokenizer.vocab_size)
    task = build_task(OmegaConf.create(cfg), tokenizer, model=model)
    task.eval()
    save_seqmix_checkpoint(out, task, {"fairseq": {"arch": fs.arch, "source": str(checkpoint)}})
    return task


def _identity_projections(family: Family, settings: dict, state: dict, embed_dim: int) -> dict:
    """Band projections fairseq has and the seqmix model leaves out (a band as wide as the model, band 0 unless
    ``task.adaptive.project_all_bands``): identity matrices, the same outputs."""
    state = dict(state)
    for rule in family.rules(settings):
        if rule.seqmix not in state and rule.seqmix.endswith("proj.weight"):
            state[rule.seqmix] = torch.eye(embed_dim)
    return state


def language_model_to_fairseq(model: dict, adaptive: dict | None, state: dict) -> dict:
    """A seqmix language model (its ``model`` config, ``task.adaptive`` and DecoderOnly state dict) as a fairseq
    ``transformer_lm`` / ``lightconv_lm`` checkpoint container (``args`` style, every setting explicit)."""
    mixer = (model.get("decoder") or {}).get("mixer") or {}
    family = FAMILIES[{"seqmix.mixers.SelfAttention": "transformer_lm",
                       "seqmix.mixers.TaLK": "talkconv_lm"}.get(mixer.get("_target_"), "lightconv_lm")]
    arch, settings = family.fairseq_settings(model, adaptive)
    fairseq_state = to_fairseq_state(family, settings, _identity_projections(family, settings, state,
                                                                            int(model["embed_dim"])))
    args = Namespace(arch=arch, task="language_modeling", data=".", sample_break_mode="none",
                     criterion="adaptive_loss" if settings["adaptive_softmax_cutoff"] else "cross_entropy",
                     optimizer="nag", lr_scheduler="cosine", lr=[1.0], dataset_impl=None, add_bos_token=False,
                     **settings)
    return {**fairseq_container(arch, settings, fairseq_state, "", ""), "args": args}


# --- export ---------------------------------------------------------------------------------------------------------
def _languages(config: dict, tokenizer) -> tuple[str, str]:
    task = config.get("task") or {}
    src = task.get("src_lang") or getattr(tokenizer, "source_lang", None) or "src"
    tgt = task.get("tgt_lang") or getattr(tokenizer, "target_lang", None) or "tgt"
    return str(src), str(tgt)


def fairseq_dictionaries(tokenizer):
    """(source, target) FairseqDictionary of a seqmix tokenizer: a dictionary tokenizer's own; for a ``tokenizers``
    model, its vocabulary after the four specials in id order (count 1 each)."""
    from seqmix.data.fairseq_dictionary import FairseqDictionary

    if hasattr(tokenizer, "source_dict"):
        return tokenizer.source_dict, tokenizer.target_dict
    hf = getattr(tokenizer, "_hf", None)
    if hf is None:
        raise SeqmixError(f"cannot export the vocabulary of a {type(tokenizer).__name__}")
    symbols = [hf.id_to_token(i) for i in range(4, tokenizer.vocab_size)]
    bad = [s for s in symbols if s is None or not s.strip() or "\n" in s]
    if bad:
        raise SeqmixError(f"the vocabulary has {len(bad)} symbols a dict.txt cannot hold (empty or multi-line)")
    joint = FairseqDictionary(symbols)
    return joint, joint


def fairseq_generation(generation: dict) -> dict:
    """A seqmix task's decoding settings as fairseq's generation options (what fairseq maps into ``cfg.generation``
    on load); what fairseq cannot express (a source-relative minimum length, stepwise length penalty) is left out."""
    options = {theirs: generation[ours] for theirs, ours in GENERATION_NAMES.items() if ours in generation}
    if generation.get("min_len_a", 0.0) != 0.0:
        options.pop("min_len", None)
    return options


def fairseq_args(arch: str, settings: dict, source_lang: str, target_lang: str,
                 generation: dict | None = None) -> Namespace:
    """An ``args`` Namespace as fairseq ≤0.9 saves it (later releases convert it on load): the registered
    architecture, every model setting explicit, the translation task's language pair and the decoding settings."""
    return Namespace(arch=arch, task="translation", source_lang=source_lang, target_lang=target_lang,
                     data=".", left_pad_source=True, left_pad_target=False, criterion="label_smoothed_cross_entropy",
                     label_smoothing=0.1, optimizer="adam", lr_scheduler="inverse_sqrt", lr=[5e-4],
                     dataset_impl=None, **fairseq_generation(generation or {}), **settings)


def fairseq_container(arch: str, settings: dict, state: dict, source_lang: str, target_lang: str,
                      generation: dict | None = None) -> dict:
    """fairseq's checkpoint container with what its ``_upgrade_state_dict`` reads (an optimizer history with an lr
    scheduler state, ``extra_state.train_iterator``)."""
    return {
        "args": fairseq_args(arch, settings, source_lang, target_lang, generation),
        "model": state,
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": None}, "num_updates": 0}],
        "extra_state": {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0}, "val_loss": None},
        "last_optimizer_state": None,
    }


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path) -> Path:
    """seqmix checkpoint → ``out_dir``/checkpoint.pt + dict.<src>.txt + dict.<tgt>.txt + seqmix_tokenizer.json."""
    from seqmix.data import Tokenizer

    ckpt = load_checkpoint(checkpoint)
    config = ckpt["seqmix"]["config"]
    model = config.get("model") or {}
    if _is_language_model(config):
        return _export_language_model(ckpt, config, Path(out_dir))
    family = family_for_seqmix(model)
    if model.get("decoder_start") != "eos":
        raise SeqmixError("cannot export to fairseq: this model was trained with bos as the decoder's first input, "
                          "fairseq-generate starts from eos, so fairseq would decode it wrongly; train with "
                          "model.decoder_start=eos")
    arch, settings = family.fairseq_settings(model)
    weights = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    state = to_fairseq_state(family, settings, weights)
    tokenizer = Tokenizer.from_json(ckpt["seqmix"]["tokenizer"])
    source_lang, target_lang = _languages(config, tokenizer)
    source_dict, target_dict = fairseq_dictionaries(tokenizer)
    out_dir = Path(out_dir)
    generation = (config.get("task") or {}).get("generation") or {}
    container = fairseq_container(arch, settings, state, source_lang, target_lang, generation)

    def write(f) -> None:
        buffer = io.BytesIO()
        torch.save(container, buffer)
        f.write(buffer.getvalue())

    atomic_write(out_dir / "checkpoint.pt", write)
    source_dict.save(out_dir / f"dict.{source_lang}.txt")
    target_dict.save(out_dir / f"dict.{target_lang}.txt")
    atomic_write_text(out_dir / TOKENIZER_FILE, ckpt["seqmix"]["tokenizer"])
    return out_dir / "checkpoint.pt"


def _is_language_model(config: dict) -> bool:
    from seqmix.config.build import task_class
    from seqmix.tasks import LanguageModelingTask

    try:
        return issubclass(task_class(OmegaConf.create({"task": config.get("task") or {}})), LanguageModelingTask)
    except Exception:  # noqa: BLE001 - no task or an unknown class: not a language model; the family lookup reports it
        return False


def _export_language_model(ckpt: dict, config: dict, out_dir: Path) -> Path:
    """A seqmix language model → ``out_dir``/checkpoint.pt (transformer_lm / lightconv_lm / talkconv_lm) + dict.txt
    (the one dictionary fairseq's language_modeling task reads) + seqmix_tokenizer.json."""
    from seqmix.data import Tokenizer

    weights = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    container = language_model_to_fairseq(config["model"], (config.get("task") or {}).get("adaptive"), weights)
    dictionary = fairseq_dictionaries(Tokenizer.from_json(ckpt["seqmix"]["tokenizer"]))[1]

    def write(f) -> None:
        buffer = io.BytesIO()
        torch.save(container, buffer)
        f.write(buffer.getvalue())

    atomic_write(out_dir / "checkpoint.pt", write)
    dictionary.save(out_dir / "dict.txt")
    atomic_write_text(out_dir / TOKENIZER_FILE, ckpt["seqmix"]["tokenizer"])
    return out_dir / "checkpoint.pt"


# --- command line ---------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = CommandParser(prog="python -m seqmix.interop.fairseq", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    imp = commands.add_parser("import", help="fairseq checkpoint.pt -> seqmix checkpoint")
    imp.add_argument("checkpoint")
    imp.add_argument("--data-dir", required=True,
                     help="folder with dict.<src>.txt and dict.<tgt>.txt (a language model: dict.txt)")
    imp.add_argument("--source-lang")
    imp.add_argument("--target-lang")
    imp.add_argument("--bpe-codes", help="subword-nmt/fastBPE codes the model's data was split with")
    imp.add_argument("--no-moses", action="store_true", help="the text is not Moses-tokenized")
    imp.add_argument("--out", required=True)
    exp = commands.add_parser("export", help="seqmix checkpoint -> fairseq checkpoint.pt + dictionaries")
    exp.add_argument("checkpoint")
    exp.add_argument("--out", required=True, help="output folder")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    def run() -> None:
        if args.command == "import":
            task = import_checkpoint(args.checkpoint, args.data_dir, args.out, args.source_lang, args.target_lang,
                                     args.bpe_codes, moses=not args.no_moses)
            print(f"imported {task.run_config['model']['name']} -> {args.out}; decode with "
                  f"python generate.py ckpt_path={args.out} input=<file>")
        else:
            print(f"exported -> {export_checkpoint(args.checkpoint, args.out)}")

    return command_status(run)


if __name__ == "__main__":
    sys.exit(main())
