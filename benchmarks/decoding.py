"""Decoding speed on Multi30k val and the BLEU of the same output, through generate.py's path (``load_task``, the task's
translator, ``decode_dataset``): autoregressive models at each beam against the Transformer (``decoding``), DisCo / CMLM
at batch size 1 and at full batches against their autoregressive teacher at the same batching (``nat``).

Each model's own hypotheses end where it says, so two models' sentences/s also differ by how long they write. The
forced-length rows (``forced_lengths``) make every hypothesis exactly L tokens long (min = max length = L): the same
search work for every model, so their ratio is the decoders' own, at Multi30k's length (~16 tokens) and longer."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch

from benchmarks import common
from benchmarks.plotting import bar_panels
from seqmix.errors import SeqmixError

TASK = "multi30k_ende"
HOW_TO_TRAIN = "python train.py experiment=multi30k_transformer_cpu (about 45 min on 2 cores)"
HOW_TO_TRAIN_NAT = ("python generate.py ckpt_path=<multi30k_transformer_cpu run>/checkpoints/best.ckpt split=train "
                    "beam_size=5 distill_dir=<dir>; python train.py experiment=multi30k_disco_cpu task.distilled_data=<dir>")
# tokens_per_s: generated tokens (eos included); cpu_*: process CPU time (CPU only); avg_iterations: NAT passes
FIELDS = ("model parameters beam sentences seconds sentences_per_s tokens_per_s bleu bleu_signature max_tokens "
          "speed_ratio max_sentences batches largest_batch decoder role length_beam max_iterations avg_iterations "
          "ckpt cpu_seconds cpu_speed_ratio batching compiled warmup_seconds compile_seconds compiled_ratio length")


@dataclass
class Settings:
    ckpts: tuple[str, ...] = ()  # default: the newest multi30k best.ckpt per model (AR, or NAT in the nat section)
    runs_dirs: tuple[str, ...] = ()  # default: $SEQMIX_LOG_DIR/runs or outputs/runs
    data_dir: str | None = None  # Multi30k folder (default: multi30k/ in paths.data_dir, as train.py)
    limit: int | None = None  # the first N val sentences (default: all 1,014)
    beams: tuple[int, ...] = (1, 5)
    max_tokens: int = 8000  # source tokens per batch
    teacher: str | None = None  # nat: default the newest multi30k Transformer
    teacher_beam: int = 5
    batch1_limit: int = 200  # nat at batch size 1: the first N sentences
    length_beam: int | None = None  # nat overrides (default: the checkpoint's task.nat)
    max_iterations: int | None = None
    warmup: int | None = None  # sentences decoded untimed before each timed pass (None: all, a server's steady state)
    # autoregressive: each (model, beam) decoded eagerly and/or with compile_decoding=true, a row each; the
    # warm-up pass (warmup_seconds) holds the compile time, ``x compiled`` divides sentences/s by the eager row's
    compile_decoding: tuple[bool, ...] = (False,)
    # autoregressive: rows whose every hypothesis is forced to L tokens, at each beam, on the first forced_limit sentences
    forced_lengths: tuple[int, ...] = (16, 64)
    forced_limit: int | None = 300


QUICK = {"limit": 100, "batch1_limit": 20, "forced_lengths": (16,), "forced_limit": 50}


def checkpoints(s: Settings, nat: bool) -> dict[str, Path]:
    """Model -> checkpoint: ``s.ckpts`` (of this kind), else the newest Multi30k best.ckpt per model of the kind."""
    dirs = [Path(d) for d in s.runs_dirs] or [Path(os.environ.get("SEQMIX_LOG_DIR", common.REPO_ROOT / "outputs")) / "runs"]
    found = {}
    for path in [Path(p) for p in s.ckpts] or sorted((p for d in dirs for p in d.glob("*/checkpoints/best.ckpt")),
                                                    key=lambda p: -p.stat().st_mtime):
        try:
            cfg = torch.load(path, map_location="cpu", weights_only=False, mmap=True)["seqmix"]["config"]
        except Exception:  # not a seqmix checkpoint
            if s.ckpts:
                raise
            continue
        targets = str(cfg["task"].get("module")) + str(cfg["model"].get("_target_"))
        kind = "NonAutoregressive" in targets or "seqmix.models.nat." in targets
        if s.ckpts and kind != nat:
            raise SeqmixError(f"{path} is {'a non-' if kind else 'an '}autoregressive model ({cfg['model']['name']}): "
                              f"decode it in the {'nat' if kind else 'decoding'} section")
        if s.ckpts or (cfg["task"]["name"] == TASK and kind == nat):
            found.setdefault(str(cfg["model"]["name"]), path)
    first = ("disco", "cmlm") if nat else ("transformer",)
    return {m: found[m] for m in sorted(found, key=lambda m: ([not m.startswith(p) for p in first], m))}


def load(ckpt: Path, s: Settings, device: torch.device) -> SimpleNamespace:
    """The checkpoint's task on ``device`` and the (first ``s.limit``) val sentences, encoded and checked by it."""
    from seqmix.config.build import load_task
    from seqmix.data import LocalParallelSource
    from seqmix.models import count_parameters

    task, cfg = load_task(str(ckpt))
    data = Path(s.data_dir or common.DATA_DIR / "multi30k")
    corpus = LocalParallelSource(str(data), "en", "de").read("val")
    sources, refs = list(corpus.src)[:s.limit], [task.tokenizer.normalize_reference(r) for r in corpus.tgt][:s.limit]
    info = {"ckpt": str(ckpt), "task": str(cfg.task.name), "model": str(cfg.model.name), "data": str(data),
            "parameters": count_parameters(task.model), "device": str(device), "torch_threads": torch.get_num_threads(),
            "generation": asdict(task.generation)}
    ids = task.prepare_source_ids(task.tokenizer.encode_batch(sources))
    return SimpleNamespace(task=task.to(device), ids=ids, sources=sources, refs=refs, info=info)


def measure(ld: SimpleNamespace, s: Settings, device: torch.device, max_sentences: int | None, n: int | None,
            compiled: bool = False, **overrides) -> dict:
    """Warm-up (with ``compiled``: compiling the decoder step), then one timed ``decode_dataset`` pass over the first
    ``n`` sentences; BLEU of that output."""
    from seqmix.data import PairDataset
    from seqmix.generation.decode import decode_dataset
    from seqmix.metrics import corpus_bleu

    ld.task.compile_decoding = compiled
    n, translate = min(n or len(ld.ids), len(ld.ids)), ld.task.translator(**overrides)
    length = overrides.get("max_len_b") if overrides.get("min_len_b") == overrides.get("max_len_b") else None

    def decode(k: int):
        data = PairDataset.from_lists(ld.ids[:k], [[] for _ in ld.ids[:k]], ld.sources[:k], ld.refs[:k])
        return decode_dataset(data, ld.task.tokenizer, translate, s.max_tokens, device, max_sentences)

    warmup = time.perf_counter()
    # both passes end on the host (detokenized text): no CUDA synchronisation needed around them. Compiled: the
    # warm-up is the timed pass itself, so that every graph its batches need (a few per model) is compiled before
    decode(n if compiled or s.warmup is None else s.warmup)
    warmup = time.perf_counter() - warmup
    seconds, cpu = time.perf_counter(), time.process_time()
    out = decode(n)
    seconds, cpu = time.perf_counter() - seconds, time.process_time() - cpu
    bleu = corpus_bleu(out.hypotheses, ld.refs[:n], tokenize=ld.task.bleu.tokenize, lowercase=ld.task.bleu.lowercase)
    batching = "batch 1" if max_sentences == 1 else f"<= {max_sentences} sent." if max_sentences else f"<= {s.max_tokens} tok"
    return common.new_row(
        FIELDS, model=ld.info["model"], parameters=ld.info["parameters"], beam=overrides.get("beam_size"), sentences=n,
        seconds=seconds, sentences_per_s=n / seconds, tokens_per_s=out.generated / seconds, bleu=bleu.score,
        bleu_signature=bleu.signature, max_tokens=s.max_tokens, max_sentences=max_sentences, decoder="beam", role="",
        batches=len(out.batch_sizes), largest_batch=max(out.batch_sizes, default=0), ckpt=ld.info["ckpt"],
        avg_iterations=sum(out.iterations) / n if out.iterations else None,
        cpu_seconds=cpu if device.type == "cpu" else None, batching=batching, compiled=compiled,
        warmup_seconds=warmup, compile_seconds=warmup - seconds if compiled else None, length=length)


def forced(beam: int, length: int) -> dict:
    """Decoding options under which every hypothesis is ``length`` tokens long (eos after them)."""
    return {"beam_size": beam, "min_len_a": 0.0, "min_len_b": length, "max_len_a": 0.0, "max_len_b": length}


def run(s: Settings, device: torch.device, log=print, nat: bool = False) -> dict | None:
    """Autoregressive: a row per (checkpoint, beam), ratios against the Transformer at the same beam. NAT: the teacher,
    then the NAT models, each at batch size 1 (the first ``s.batch1_limit`` sentences) and at full batches, ratios
    against the teacher at the same batching. None when there is no checkpoint."""
    models = checkpoints(s, nat)
    if not models:
        log(f"no {'DisCo/CMLM' if nat else 'autoregressive'} {TASK} checkpoint found; skipped. Make one: "
            + (HOW_TO_TRAIN_NAT if nat else HOW_TO_TRAIN))
        return None
    jobs = [(p, "", [{"beam_size": int(b)} for b in s.beams] + [forced(int(b), int(n)) for n in s.forced_lengths
                                                                for b in s.beams]) for p in models.values()]
    if nat:
        teacher = checkpoints(replace(s, ckpts=(s.teacher,) if s.teacher else ()), False)
        teacher = [p for m, p in teacher.items() if s.teacher or m.startswith("transformer")][:1]
        jobs = [(p, "teacher", [{"beam_size": s.teacher_beam}]) for p in teacher] + [
            (p, "nat", [{"length_beam": s.length_beam, "max_iterations": s.max_iterations}]) for p in models.values()]
    infos, rows = [], []
    for path, role, variants in jobs:
        ld = load(path, s, device)
        infos.append(ld.info | {"role": role, "decoders": variants})
        for overrides in variants:
            opts = ld.task.nat_options(**overrides) if role == "nat" else None
            runs = [(1, s.batch1_limit or None, False), (None, None, False)] if nat else [
                (None, s.forced_limit if "max_len_b" in overrides else None, compiled)
                for compiled in s.compile_decoding]
            for max_sentences, n, compiled in runs:
                rows.append(measure(ld, s, device, max_sentences, n, compiled, **overrides) | {"role": role})
                if opts:
                    rows[-1] |= {"decoder": opts.algorithm, "length_beam": opts.length_beam,
                                 "max_iterations": opts.max_iterations}
                log(f"  {ld.info['model']} {role} {rows[-1]['batching']} beam {rows[-1]['beam']}"
                    f"{' compiled' if compiled else ''}{length_text(rows[-1])}: "
                    f"{rows[-1]['sentences_per_s']:.1f} sentences/s, BLEU {rows[-1]['bleu']:.2f}")
    rows.sort(key=lambda r: r["max_sentences"] is None)  # stable: batch 1 first, the teacher first within each
    base = next(iter(models)) if not nat else None
    common.add_ratios(rows, lambda r: (None if nat else r["beam"], r["max_sentences"], r["compiled"], r["length"]),
                      lambda r: r["role"] == "teacher" if nat else r["model"] == base, speed_ratio="sentences_per_s",
                      cpu_speed_ratio=lambda r: r["cpu_seconds"] and r["sentences"] / r["cpu_seconds"])
    common.add_ratios(rows, lambda r: (r["model"], r["role"], r["beam"], r["max_sentences"], r["length"]),
                      lambda r: not r["compiled"], compiled_ratio="sentences_per_s")
    return {"info": infos, "rows": rows}


def length_text(row: dict) -> str:
    return "" if row["length"] is None else f" forced to {row['length']} tokens"


TABLE = [("model", "model", ""), ("params", lambda r: f"{r['parameters'] / 1e6:.1f}M", ""), ("beam", "beam", ""),
         ("length", lambda r: "own" if r["length"] is None else f"= {r['length']}", ""),
         ("sentences", "sentences", ""), ("seconds", "seconds", ".1f"), ("sent/s", "sentences_per_s", ".1f"),
         ("tok/s", "tokens_per_s", ".0f"), ("BLEU", "bleu", ".2f"), ("speed x", "speed_ratio", ".2f"),
         ("cpu x", "cpu_speed_ratio", ".2f"), ("compiled", lambda r: "yes" if r["compiled"] else "", ""),
         ("warm-up s", "warmup_seconds", ".1f"), ("compile s", "compile_seconds", ".1f"),
         ("x compiled", "compiled_ratio", ".2f")]
NAT_TABLE = [("model", "model", ""), ("decoder", lambda r: r["decoder"] if r["beam"] is None else f"beam {r['beam']}", ""),
             ("batching", "batching", ""), ("sentences", "sentences", ""), ("batches", "batches", ""),
             ("seconds", "seconds", ".1f"), ("sent/s", "sentences_per_s", ".1f"), ("speed x", "speed_ratio", ".2f"),
             ("cpu x", "cpu_speed_ratio", ".2f"), ("BLEU", "bleu", ".2f"), ("avg iter", "avg_iterations", ".2f"),
             ("len beam", "length_beam", ""), ("max iter", "max_iterations", "")]


def section(s: Settings, device: torch.device, out: Path, log=print, nat: bool = False) -> tuple[dict, list[str]]:
    """Table, CSV and a bar panel per beam (nat: per batching): sentences/s, BLEU, ratio, iterations on the bars."""
    name = "nat" if nat else "decoding"
    log(f"\n== {name}: " + ("DisCo/CMLM against their autoregressive teacher" if nat else "autoregressive models"))
    res = run(s, device, log, nat)
    if res is None:
        return {"skipped": "no checkpoint; " + (HOW_TO_TRAIN_NAT if nat else HOW_TO_TRAIN)}, []
    common.print_table(f"speed x: sentences/s over the {'teacher' if nat else 'Transformer'}'s with the same "
                       f"{'batching' if nat else 'beam and length'}, this run; cpu x: the same per CPU second"
                       + ("" if nat else "; length = L: every hypothesis forced to L tokens (BLEU meaningless)"),
                       res["rows"],
                       NAT_TABLE if nat else TABLE)
    panels: dict = {}
    for r in res["rows"]:
        note = f"{r['sentences_per_s']:.1f}\nBLEU {r['bleu']:.1f}\n{common.cell(r['speed_ratio'], '.2f')}x" + (
            "" if r["avg_iterations"] is None else f"\n{r['avg_iterations']:.1f} it.")
        label = f"{r['model']}\n{r['decoder'] if r['beam'] is None else 'beam ' + str(r['beam'])}" + (
            "\ncompiled" if r["compiled"] else "")
        group = f"{r['batching'] if nat else 'beam ' + str(r['beam'])}{length_text(r)} ({r['sentences']} sent.)"
        panels.setdefault(group, []).append((label, r["sentences_per_s"], note, r["speed_ratio"] == 1.0))
    bar_panels(panels, "sentences / s", out / f"{name}.png", f"Multi30k val, {res['info'][0]['device']}")
    return {"info": res["info"], "rows": common.write_csv(out / f"{name}.csv", res["rows"])}, []
