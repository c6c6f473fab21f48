"""Decoding benchmark: sentences/s of beam search on Multi30k val for trained checkpoints, with their BLEU.

By default it takes the newest Multi30k ``best.ckpt`` of every model (Transformer, LightConv, DynamicConv, TaLK,
...) so the conv decoders are timed next to the Transformer of the same size in the same run; speed ratios are
against the Transformer at the same beam. BLEU is reported next to each speed so that a faster decoder that
translates worse is visible as such. Batching follows ``generate.py`` (token-budget batches, sorted by length).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from seqmix.errors import SeqmixError

REPO_ROOT = Path(__file__).resolve().parents[1]
TASK_NAME = "multi30k_ende"
HOW_TO_TRAIN = ("python train.py experiment=multi30k_transformer_cpu   "
                "(about 45 min on 2 CPU cores), then rerun, or pass --ckpt <run>/checkpoints/best.ckpt")


@dataclass
class DecodeResult:
    model: str
    parameters: int
    beam: int
    sentences: int
    seconds: float
    sentences_per_s: float
    tokens_per_s: float  # generated target tokens (incl. eos) of the best hypotheses per second
    bleu: float
    bleu_signature: str
    max_tokens: int
    speed_ratio: float | None = None  # sentences/s over the baseline model's at the same beam


def default_runs_dir() -> Path:
    """Where train.py writes runs: ``$SEQMIX_LOG_DIR/runs`` or ``<repo>/outputs/runs`` (conf/paths)."""
    return Path(os.environ.get("SEQMIX_LOG_DIR", REPO_ROOT / "outputs")) / "runs"


def default_data_dir() -> Path:
    return Path(os.environ.get("SEQMIX_DATA_DIR", REPO_ROOT.parent / "shared" / "data")) / "multi30k"


def checkpoint_meta(path: Path) -> tuple[str | None, str | None]:
    """(task name, model name) stored in a seqmix checkpoint; Nones when unreadable / not a seqmix checkpoint."""
    try:
        cfg = torch.load(path, map_location="cpu", weights_only=False, mmap=True)["seqmix"]["config"]
        return str(cfg["task"]["name"]), str(cfg["model"]["name"])
    except Exception:
        return None, None


def find_checkpoints(runs_dir: Path | None = None, task: str = TASK_NAME) -> list[Path]:
    """The newest ``<runs_dir>/*/checkpoints/best.ckpt`` trained on ``task`` for each model name, Transformer
    first (the baseline of the speed ratios)."""
    runs_dir = Path(runs_dir) if runs_dir else default_runs_dir()
    candidates = sorted(runs_dir.glob("*/checkpoints/best.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    newest: dict[str, Path] = {}
    for path in candidates:
        ckpt_task, model = checkpoint_meta(path)
        if ckpt_task == task:
            newest.setdefault(model, path)
    return [newest[m] for m in sorted(newest, key=lambda m: (not m.startswith("transformer"), m))]


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def decode_once(model, tokenizer, dataset, refs: list[str], search, max_tokens: int, device: torch.device,
                bleu_opts: dict) -> DecodeResult:
    """Decode the whole dataset once with ``search``; time everything from batching to detokenized text."""
    from seqmix.generation.decode import decode_dataset
    from seqmix.metrics import corpus_bleu

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    hyps, generated = decode_dataset(model, tokenizer, dataset, search, max_tokens, device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    bleu = corpus_bleu(hyps, refs, **bleu_opts)
    return DecodeResult("", 0, search.beam_size, len(hyps), elapsed, len(hyps) / max(elapsed, 1e-9),
                        generated / max(elapsed, 1e-9), bleu.score, bleu.signature, max_tokens)


def run_decoding_benchmark(ckpt: str | Path | list | None = None, beams: tuple[int, ...] = (1, 5),
                           limit: int | None = None, max_tokens: int = 8000, device: str = "auto",
                           data_dir: str | Path | None = None, runs_dir: str | Path | None = None,
                           log=print) -> dict | None:
    """Speed and BLEU per (checkpoint, beam); None (after saying how to make a checkpoint) when there is none.
    ``ckpt``: one path, a list, or None for :func:`find_checkpoints`."""
    if ckpt is None:
        ckpts = find_checkpoints(runs_dir)
        if not ckpts:
            log(f"decoding: no {TASK_NAME} checkpoint under {Path(runs_dir) if runs_dir else default_runs_dir()}; "
                f"skipped. Make one with:\n    {HOW_TO_TRAIN}")
            return None
    else:
        ckpts = [ckpt] if isinstance(ckpt, (str, Path)) else list(ckpt)
    infos, rows = [], []
    for path in ckpts:
        res = decode_checkpoint(Path(path), beams, limit, max_tokens, device, data_dir, log)
        infos.append(res["info"])
        rows.extend(res["rows"])
    add_speed_ratios(rows)
    return {"info": infos, "rows": rows}


def add_speed_ratios(rows: list[DecodeResult]) -> None:
    """Against the first Transformer row with the same beam (or the first model's, without a Transformer)."""
    models = list(dict.fromkeys(r.model for r in rows))
    base_model = next((m for m in models if m.startswith("transformer")), models[0] if models else None)
    base = {r.beam: r.sentences_per_s for r in rows if r.model == base_model}
    for r in rows:
        r.speed_ratio = r.sentences_per_s / base[r.beam] if base.get(r.beam) else None


def decode_checkpoint(ckpt: Path, beams: tuple[int, ...], limit: int | None, max_tokens: int, device: str,
                      data_dir: str | Path | None, log=print) -> dict:
    """One checkpoint: {"info", "rows"} with a row per beam size."""
    from omegaconf import OmegaConf

    from seqmix.cli.common import count_parameters
    from seqmix.cli.generate import load_for_inference
    from seqmix.data import LocalParallelSource, PairDataset
    from seqmix.generation import BeamSearch

    model, tokenizer, train_cfg = load_for_inference(str(ckpt))
    task = train_cfg.task.name
    if task != TASK_NAME:
        log(f"decoding: warning: {ckpt} was trained on task {task!r}, not {TASK_NAME!r}; BLEU will be meaningless")
    dev = _device(device)
    model.to(dev)

    data_path = Path(data_dir) if data_dir else default_data_dir()
    corpus = LocalParallelSource(str(data_path), "en", "de").read("val")
    src_texts, ref_texts = list(corpus.src), list(corpus.tgt)
    if limit:
        src_texts, ref_texts = src_texts[:limit], ref_texts[:limit]
    src_ids = tokenizer.encode_batch(src_texts)
    max_src = int(train_cfg.model.max_source_positions)
    too_long = sum(len(ids) + 1 > max_src for ids in src_ids)
    if too_long:
        raise SeqmixError(f"{too_long} val sentences exceed max_source_positions={max_src}; cannot benchmark")
    dataset = PairDataset(src_ids, [[] for _ in src_ids], src_texts, ref_texts)
    refs = [tokenizer.normalize_reference(r) for r in ref_texts]
    gen_opts = dict(OmegaConf.to_container(train_cfg.task.generation, resolve=True))
    bleu_opts = dict(OmegaConf.to_container(train_cfg.task.bleu, resolve=True))

    info = {"ckpt": str(ckpt), "task": task, "model": str(train_cfg.model.name), "parameters": count_parameters(model),
            "data": str(data_path), "split": "val", "device": str(dev), "torch_threads": torch.get_num_threads(),
            "generation": gen_opts}
    log(f"decoding: {ckpt} ({info['model']}, {info['parameters']:,} parameters), {len(src_texts)} val sentences")
    rows = []
    for beam in beams:
        opts = gen_opts | {"beam_size": int(beam)}
        search = BeamSearch(bos=tokenizer.bos, eos=tokenizer.eos, pad=tokenizer.pad, unk=tokenizer.unk,
                            max_target_positions=int(train_cfg.model.max_target_positions), **opts)
        # Warm-up on a few sentences so first-call costs are not billed to the timed pass.
        warm = PairDataset(src_ids[:8], [[] for _ in src_ids[:8]], src_texts[:8], ref_texts[:8])
        decode_once(model, tokenizer, warm, refs[:8], search, max_tokens, dev, bleu_opts)
        row = decode_once(model, tokenizer, dataset, refs, search, max_tokens, dev, bleu_opts)
        row.model, row.parameters = info["model"], info["parameters"]
        rows.append(row)
        log(f"  beam {beam}: {row.sentences_per_s:.1f} sentences/s ({row.seconds:.1f}s), BLEU {row.bleu:.2f}")
    return {"info": info, "rows": rows}


def format_table(rows: list[DecodeResult]) -> str:
    header = ["model", "params", "beam", "sentences", "seconds", "sent/s", "tok/s", "BLEU", "speed x"]
    lines = [[r.model, f"{r.parameters / 1e6:.1f}M", str(r.beam), str(r.sentences), f"{r.seconds:.1f}",
              f"{r.sentences_per_s:.1f}", f"{r.tokens_per_s:.0f}", f"{r.bleu:.2f}",
              "-" if r.speed_ratio is None else f"{r.speed_ratio:.2f}"] for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]

    def render(cells):
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths))

    return "\n".join([render(header), "  ".join("-" * w for w in widths), *(render(line) for line in lines)])


def as_dicts(rows: list[DecodeResult]) -> list[dict]:
    return [asdict(r) for r in rows]
