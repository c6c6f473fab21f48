"""Serving speed of one Transformer four ways on Multi30k val, beam 5: seqmix eager (float32), seqmix with int8 Linear
layers (``generate.py quantize=int8``), CTranslate2 float32 and int8 exports of the same checkpoint
(``python -m seqmix.interop.ctranslate2 export``). Same thread count everywhere (``torch.set_num_threads`` and
CTranslate2's ``intra_threads``), same batching (source-token budget, sorted by length), sentences/s and sacreBLEU of
each output, ratios against CTranslate2 float32 measured in the same run, and how many outputs equal seqmix eager's.

``python -m benchmarks.serving [--checkpoint best.ckpt] [--quick]`` (or ``python -m benchmarks.run --only serving``).
Without a checkpoint: the newest Multi30k Transformer run's best.ckpt, else a small Transformer trained here for
``train_seconds`` (its BLEU is low; the speeds are what this compares)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks import common, decoding
from benchmarks.plotting import bar_panels

FIELDS = ("engine compute beam threads sentences seconds sentences_per_s tokens_per_s bleu same_as_eager speed_ratio "
          "model parameters max_tokens ckpt status")
BASELINE = ("ctranslate2", "float32")
VARIANTS = (("seqmix", "float32"), ("seqmix", "int8"), ("ctranslate2", "float32"), ("ctranslate2", "int8"))


@dataclass
class Settings:
    checkpoint: str | None = None  # default: newest multi30k transformer best.ckpt, else one trained here
    data_dir: str | None = None  # Multi30k folder (default: multi30k/ in paths.data_dir, as train.py)
    limit: int | None = None  # the first N val sentences (default: all 1,014)
    beam: int = 5
    threads: int | None = None  # default: torch's current count; CTranslate2 gets the same
    max_tokens: int = 8000  # source tokens per batch, both engines
    warmup: int | None = None  # sentences decoded untimed first, per engine (None: all, a server's steady state)
    # no checkpoint: a model of experiment=multi30k_transformer_cpu with these overrides, trained this long
    train_seconds: float = 300.0
    model_overrides: tuple[str, ...] = ()
    vocab_size: int = 8000
    train_max_tokens: int = 4096
    train_split: str = "train"


QUICK = {"limit": 100, "train_seconds": 30.0}


def train_quick_model(s: Settings, out: Path, log=print) -> Path:
    """A Transformer of the Multi30k CPU recipe trained for ``s.train_seconds`` with a plain loop (Adam, inverse-sqrt
    schedule, the task's label-smoothed loss), saved as a seqmix checkpoint in ``out``."""
    from seqmix.config.build import build_task
    from seqmix.data import LocalParallelSource
    from seqmix.data.dataset import collate_pairs, filter_by_length
    from seqmix.data.tokenizer import train_tokenizer
    from seqmix.interop.fairseq import save_seqmix_checkpoint

    data = Path(s.data_dir or common.DATA_DIR / "multi30k")
    corpus = LocalParallelSource(str(data), "en", "de").read(s.train_split)
    src, tgt = list(corpus.src), list(corpus.tgt)
    tok = train_tokenizer(src + tgt, vocab_size=s.vocab_size, min_frequency=2)
    cfg = common.compose_train(["experiment=multi30k_transformer_cpu", *s.model_overrides])
    torch.manual_seed(1)
    task = build_task(cfg, tok)
    # pairs longer than the model's positions are left out with train.py's length filter (which pairs a timed run
    # reaches depends on the machine's speed)
    encoded = list(zip(tok.encode_batch(src), tok.encode_target_batch(tgt)))
    keep, _ = filter_by_length([len(a) + 1 for a, _ in encoded], [len(b) + 1 for _, b in encoded],
                               int(cfg.model.max_source_positions), int(cfg.model.max_target_positions))
    pairs = sorted((encoded[i] for i in keep), key=lambda p: (len(p[0]), len(p[1])))
    batches, batch, width = [], [], 0
    for pair in pairs:  # token-budget batches of similar lengths
        width = max(width, len(pair[0]) + 1, len(pair[1]) + 1)
        if batch and width * (len(batch) + 1) > s.train_max_tokens:
            batches.append(batch)
            batch, width = [], max(len(pair[0]), len(pair[1])) + 1
        batch.append(pair)
    batches.append(batch)
    opt = torch.optim.Adam(task.model.parameters(), lr=float(cfg.optim.lr), betas=(0.9, 0.98))
    warmup, peak = int(cfg.scheduler.warmup_updates), float(cfg.optim.lr)
    rng, started, updates, loss = random.Random(1), time.perf_counter(), 0, math.nan
    task.model.train()
    while time.perf_counter() - started < s.train_seconds:
        chosen = rng.choice(batches)
        samples = [{"id": i, "source": torch.tensor([*a, tok.eos]), "target": torch.tensor([*b, tok.eos])}
                   for i, (a, b) in enumerate(chosen)]
        for group in opt.param_groups:
            group["lr"] = peak * min((updates + 1) / warmup, math.sqrt(warmup / (updates + 1)))
        total, _, n = task.compute_loss(collate_pairs(samples, tok.pad, tok.bos, tok.eos))
        opt.zero_grad()
        (total / n).backward()
        opt.step()
        updates, loss = updates + 1, float(total.detach()) / n
    task.model.eval()
    path = out / "serving_model.ckpt"
    save_seqmix_checkpoint(path, task, {"benchmark": {"updates": updates, "seconds": s.train_seconds}})
    log(f"  trained {cfg.model.name} for {updates} updates ({s.train_seconds:.0f}s, last loss {loss:.2f}) -> {path}")
    return path


def find_checkpoint(s: Settings, out: Path, log=print) -> Path:
    if s.checkpoint:
        return Path(s.checkpoint)
    found = decoding.checkpoints(decoding.Settings(), nat=False)
    transformer = [p for m, p in found.items() if m.startswith("transformer")]
    if transformer:
        log(f"  checkpoint: {transformer[0]} (the newest Multi30k Transformer run)")
        return transformer[0]
    log(f"  no Multi30k Transformer checkpoint found: training one for {s.train_seconds:.0f}s "
        f"(pass --checkpoint <run>/checkpoints/best.ckpt to measure a real one)")
    return train_quick_model(s, out, log)


def _row(ld: SimpleNamespace, s: Settings, engine: str, compute: str, **values) -> dict:
    return common.new_row(FIELDS, engine=engine, compute=compute, beam=s.beam, threads=torch.get_num_threads(),
                          model=ld.info["model"], parameters=ld.info["parameters"], max_tokens=s.max_tokens,
                          ckpt=ld.info["ckpt"], **{"status": "ok", **values})


def measure_seqmix(ld: SimpleNamespace, s: Settings, compute: str) -> tuple[dict, list[str]]:
    """generate.py's path (the task's translator, ``decode_dataset``), the model's Linear layers int8 for
    ``compute="int8"``: a warm-up pass, then one timed pass over every sentence."""
    from seqmix.data import PairDataset
    from seqmix.generation.decode import decode_dataset
    from seqmix.metrics import corpus_bleu
    from seqmix.models.quantized import quantize_int8

    model = ld.task.model
    if compute == "int8":
        ld.task.model = quantize_int8(model)
    try:
        translate = ld.task.translator(beam_size=s.beam)

        def decode(k: int):
            data = PairDataset.from_lists(ld.ids[:k], [[] for _ in ld.ids[:k]], ld.sources[:k], ld.refs[:k])
            return decode_dataset(data, ld.task.tokenizer, translate, s.max_tokens, torch.device("cpu"))

        decode(len(ld.ids) if s.warmup is None else s.warmup)
        seconds = time.perf_counter()
        decoded = decode(len(ld.ids))
        seconds = time.perf_counter() - seconds
    finally:
        ld.task.model = model
    hyps = decoded.hypotheses
    bleu = corpus_bleu(hyps, ld.refs, tokenize=ld.task.bleu.tokenize, lowercase=ld.task.bleu.lowercase)
    return _row(ld, s, "seqmix", compute, sentences=len(hyps), seconds=seconds, sentences_per_s=len(hyps) / seconds,
                tokens_per_s=decoded.generated / seconds, bleu=bleu.score), hyps


def measure_ctranslate2(ld: SimpleNamespace, s: Settings, folder: Path, compute: str) -> tuple[dict, list[str]]:
    from seqmix.interop.ctranslate2_decoding import CT2Translator
    from seqmix.metrics import corpus_bleu

    translator = CT2Translator(folder, compute_type="default", intra_threads=torch.get_num_threads())

    def run(texts):
        return translator.translate_hypotheses(texts, max_batch_size=s.max_tokens, batch_type="tokens",
                                               return_scores=False, beam_size=s.beam)

    run(ld.sources[:s.warmup])
    seconds = time.perf_counter()
    hyps = run(ld.sources)
    seconds = time.perf_counter() - seconds
    texts = [h.text for h in hyps]
    bleu = corpus_bleu(texts, ld.refs, tokenize=ld.task.bleu.tokenize, lowercase=ld.task.bleu.lowercase)
    generated = sum(len(h.tokens) + 1 for h in hyps)
    return _row(ld, s, "ctranslate2", compute, sentences=len(texts), seconds=seconds,
                sentences_per_s=len(texts) / seconds, tokens_per_s=generated / seconds, bleu=bleu.score), texts


def run(s: Settings, out: Path, log=print) -> dict:
    from seqmix.interop.ctranslate2 import export_checkpoint

    threads = s.threads or torch.get_num_threads()
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ckpt = find_checkpoint(s, out, log)
        ld = decoding.load(ckpt, decoding.Settings(data_dir=s.data_dir, limit=s.limit), torch.device("cpu"))
        rows, outputs = [], {}
        for engine, compute in VARIANTS:
            try:
                if engine == "seqmix":
                    row, hyps = measure_seqmix(ld, s, compute)
                else:
                    folder = out / f"ctranslate2_{compute}"
                    if not (folder / "model.bin").is_file():
                        export_checkpoint(ckpt, folder, None if compute == "float32" else compute)
                    row, hyps = measure_ctranslate2(ld, s, folder, compute)
                outputs[(engine, compute)] = hyps
            except Exception as err:  # noqa: BLE001 - a failed variant is a row with its status, the others go on
                row = _row(ld, s, engine, compute, status=common.error_status(err))
            rows.append(row)
            if common.ok(row):
                log(f"  {engine} {compute}: {row['sentences_per_s']:.1f} sentences/s, BLEU {row['bleu']:.2f}")
            else:
                log(f"  {engine} {compute}: {row['status']}")
    finally:
        torch.set_num_threads(previous)
    eager = outputs.get(("seqmix", "float32"))
    for row in rows:
        hyps = outputs.get((row["engine"], row["compute"]))
        if eager is not None and hyps is not None:
            row["same_as_eager"] = sum(a == b for a, b in zip(hyps, eager)) / len(eager)
    common.add_ratios(rows, lambda r: r["beam"], lambda r: (r["engine"], r["compute"]) == BASELINE,
                      speed_ratio="sentences_per_s")
    return {"info": ld.info | {"threads": threads}, "rows": rows}


TABLE = [("engine", "engine", ""), ("weights", "compute", ""), ("beam", "beam", ""), ("threads", "threads", ""),
         ("sentences", "sentences", ""), ("seconds", "seconds", ".1f"), ("sent/s", "sentences_per_s", ".1f"),
         ("tok/s", "tokens_per_s", ".0f"), ("BLEU", "bleu", ".2f"), ("same as eager", "same_as_eager", ".1%"),
         ("x ct2 fp32", "speed_ratio", ".2f"), ("status", "status", "")]


def section(s: Settings, device: torch.device, out: Path, log=print) -> tuple[dict, list[str]]:
    """Table, ``serving.csv`` and ``serving.png`` (a bar per engine and weights: sentences/s, BLEU, ratio)."""
    log("\n== serving: seqmix eager / int8 against CTranslate2 float32 / int8 (CPU)")
    if device.type != "cpu":
        log(f"  measured on the CPU (the comparison is CPU serving), not {device}")
    res = run(s, out, log)
    common.print_table(f"x ct2 fp32: sentences/s over CTranslate2 float32's, this run; {res['info']['threads']} "
                       f"threads each; {res['info']['model']} ({res['info']['parameters'] / 1e6:.1f}M parameters)",
                       res["rows"], TABLE)
    bars = [(f"{r['engine']}\n{r['compute']}", r["sentences_per_s"],
             f"{common.cell(r['sentences_per_s'], '.1f')}\nBLEU {common.cell(r['bleu'], '.1f')}\n"
             f"{common.cell(r['speed_ratio'], '.2f')}x", (r["engine"], r["compute"]) == BASELINE)
            for r in res["rows"]]
    bar_panels({f"beam {s.beam}, {res['info']['threads']} threads": bars}, "sentences / s", out / "serving.png",
               f"Multi30k val, CPU serving: {res['info']['model']}")
    failed = [f"serving {r['engine']} {r['compute']}: {r['status']}" for r in res["rows"] if not common.ok(r)]
    return {"info": res["info"], "rows": common.write_csv(out / "serving.csv", res["rows"])}, failed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serving", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", help="a seqmix Transformer checkpoint (default: see the module's docstring)")
    p.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK}")
    p.add_argument("--threads", type=int, help="threads for both engines (default: torch's)")
    p.add_argument("--limit", type=int, help="the first N val sentences")
    p.add_argument("--data-dir", help="Multi30k folder")
    p.add_argument("--train-seconds", type=float, help="without a checkpoint: training time of the model made here")
    p.add_argument("--out", type=Path, help="results folder (default: benchmarks/results/<timestamp>)")
    args = p.parse_args(argv)
    s = dataclasses.replace(Settings(), **(QUICK if args.quick else {}))
    given = {"checkpoint": args.checkpoint, "threads": args.threads, "limit": args.limit, "data_dir": args.data_dir,
             "train_seconds": args.train_seconds}
    s = dataclasses.replace(s, **{k: v for k, v in given.items() if v is not None})
    out = args.out or common.REPO_ROOT / "benchmarks" / "results" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out.mkdir(parents=True, exist_ok=True)
    _, failed = section(s, torch.device("cpu"), out)
    print(f"\nresults: {out}", *(f"FAILED {line}" for line in failed), sep="\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
