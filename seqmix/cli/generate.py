"""`python generate.py`: rebuild a model from its checkpoint, decode a split, score it with sacreBLEU."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from seqmix.checkpoint import average_checkpoints, latest_epoch_checkpoints, load_checkpoint
from seqmix.cli.common import build_model, count_parameters
from seqmix.data import PairDataset, Tokenizer
from seqmix.errors import SeqmixError
from seqmix.generation import BeamSearch
from seqmix.generation.decode import decode_dataset
from seqmix.metrics import corpus_bleu

GENERATION_KEYS = ("beam_size", "len_penalty", "max_len_a", "max_len_b", "min_len_a", "min_len_b",
                   "no_repeat_ngram_size")


def load_for_inference(ckpt_path: str, average_last: int = 0):
    """(model in eval mode, tokenizer, training config) from a checkpoint, optionally averaged."""
    if average_last and average_last > 1:
        paths = latest_epoch_checkpoints(Path(ckpt_path).parent, average_last)
        ckpt = average_checkpoints(paths)
    else:
        ckpt = load_checkpoint(ckpt_path)
    meta = ckpt["seqmix"]
    train_cfg = OmegaConf.create(meta["config"])
    tokenizer = Tokenizer.from_json(meta["tokenizer"])
    model = build_model(train_cfg.model, tokenizer.vocab_size, tokenizer.vocab_size, tokenizer.pad)
    state = {k.removeprefix("model."): v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SeqmixError(f"checkpoint {ckpt_path} does not match its own model config "
                          f"(missing {missing[:3]}, unexpected {unexpected[:3]}); it is corrupt or from another version")
    model.eval()
    return model, tokenizer, train_cfg


def _read_lines(path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise SeqmixError(f"input file {p} does not exist")
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n").rstrip("\r") for line in f]


def read_sources(cfg: DictConfig, train_cfg: DictConfig) -> tuple[list[str], list[str] | None]:
    if cfg.input:
        src = _read_lines(cfg.input)
        refs = _read_lines(cfg.reference) if cfg.reference else None
        if refs is not None and len(refs) != len(src):
            raise SeqmixError(f"{cfg.input} has {len(src)} lines but {cfg.reference} has {len(refs)}")
        return src, refs
    splits = train_cfg.task.data.splits
    split_name = splits.get(cfg.split)
    if split_name is None:
        have = [k for k, v in splits.items() if v is not None]
        raise SeqmixError(f"task {train_cfg.task.name} has no '{cfg.split}' split; choose split= one of {have} "
                          "or pass input=<file>")
    source_cfg = OmegaConf.merge(train_cfg.task.data.source, cfg.data or {})
    corpus = instantiate(source_cfg).read(split_name)
    return corpus.src, corpus.tgt


def generate(cfg: DictConfig) -> float | None:
    model, tokenizer, train_cfg = load_for_inference(cfg.ckpt_path, cfg.average_last)
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if cfg.device == "auto" else cfg.device))
    model.to(device)
    src_texts, refs = read_sources(cfg, train_cfg)
    max_src = int(train_cfg.model.max_source_positions)
    src_ids = tokenizer.encode_batch(src_texts)
    too_long = [i + 1 for i, ids in enumerate(src_ids) if len(ids) + 1 > max_src]
    if too_long:
        raise SeqmixError(f"{len(too_long)} source lines are longer than the model's max_source_positions={max_src} "
                          f"tokens (lines {too_long[:5]}...); split or shorten them")
    dataset = PairDataset(src_ids, [[] for _ in src_ids], src_texts, refs or ["" for _ in src_texts])
    gen_opts = dict(train_cfg.task.generation)
    gen_opts.update({k: cfg[k] for k in GENERATION_KEYS if cfg.get(k) is not None})
    search = BeamSearch(bos=tokenizer.bos, eos=tokenizer.eos, pad=tokenizer.pad, unk=tokenizer.unk,
                        max_target_positions=int(train_cfg.model.max_target_positions), **gen_opts)
    start = time.perf_counter()
    hyps, _ = decode_dataset(model, tokenizer, dataset, search, int(cfg.max_tokens), device)
    elapsed = time.perf_counter() - start
    out_path = Path(cfg.output)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    print(f"model: {train_cfg.model.name} ({count_parameters(model):,} parameters), beam {search.beam_size}")
    print(f"decoded {len(hyps)} sentences in {elapsed:.1f}s ({len(hyps) / max(elapsed, 1e-9):.1f} sentences/s)")
    print(f"hypotheses: {out_path}")
    if refs is None:
        return None
    refs = [tokenizer.normalize_reference(r) for r in refs]
    result = corpus_bleu(hyps, refs, **dict(train_cfg.task.bleu))
    print(f"BLEU: {result.score:.2f}")
    print(f"sacreBLEU: {result}")
    return result.score
