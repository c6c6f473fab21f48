"""Decoding benchmark: sentences/s on Multi30k val for trained checkpoints, with their BLEU.

Autoregressive section (``run_decoding_benchmark``): by default the newest Multi30k ``best.ckpt`` of every
autoregressive model (Transformer, LightConv, DynamicConv, TaLK, ConvS2S, ...) so the conv decoders are timed next
to the Transformer of the same size in the same run; speed ratios are against the Transformer at the same beam.

Non-autoregressive section (``run_nat_benchmark``): the newest Multi30k DisCo (parallel easy-first) and CMLM
(mask-predict) checkpoints, each at batch size 1 (one sentence per batch, on the first ``batch1_limit`` val
sentences) and at full token-budget batches, next to their autoregressive teacher (the newest Multi30k Transformer)
at beam 5 decoded with the same batching in the same run; speed ratios are against the teacher at the same
batching, and each NAT row carries its average number of decoder passes, length beam and max iterations.

BLEU is reported next to each speed so that a faster decoder that translates worse is visible as such. Batching
follows ``generate.py`` (token-budget batches sorted by length; ``max_sentences=1`` for batch size 1), and so do the
decoders (the task's ``beam_search`` / ``decoder_settings`` with the checkpoint's generation settings).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from seqmix.errors import SeqmixError

REPO_ROOT = Path(__file__).resolve().parents[1]
TASK_NAME = "multi30k_ende"
HOW_TO_TRAIN = ("python train.py experiment=multi30k_transformer_cpu   "
                "(about 45 min on 2 CPU cores), then rerun, or pass --ckpt <run>/checkpoints/best.ckpt")
HOW_TO_TRAIN_NAT = ("with a multi30k_transformer_cpu teacher: python generate.py ckpt_path=<teacher>/checkpoints/"
                    "best.ckpt split=train beam_size=5 distill_dir=<dir>; then python train.py "
                    "experiment=multi30k_disco_cpu task.distilled_data=<dir> (and experiment=multi30k_cmlm_cpu); "
                    "or pass --nat-ckpt <run>/checkpoints/best.ckpt")
WARMUP_SENTENCES = 8


@dataclass
class DecodeResult:
    model: str
    parameters: int
    beam: int | None  # beam size (autoregressive); None for a non-autoregressive row
    sentences: int
    seconds: float
    sentences_per_s: float
    tokens_per_s: float  # generated target tokens (incl. eos) of the best hypotheses per second
    bleu: float
    bleu_signature: str
    max_tokens: int
    speed_ratio: float | None = None  # sentences/s over the baseline's (same beam, or the teacher's, same batching)
    max_sentences: int | None = None  # sentences per batch at most (1: batch size 1); None: token budget only
    batches: int = 0  # batches of the timed pass
    largest_batch: int = 0  # most sentences in one batch of the timed pass
    decoder: str = "beam"  # beam | easy_first | mask_predict
    role: str = ""  # non-autoregressive section: "teacher" or "nat"
    length_beam: int | None = None  # NAT: candidate lengths per source
    max_iterations: int | None = None  # NAT: decoder passes at most
    avg_iterations: float | None = None  # NAT: decoder passes per sentence, mean over the timed pass
    ckpt: str = ""
    # process CPU time of the timed pass (all threads; on a CPU shared with another job the wall clock includes
    # waiting for a core, this does not) and the speed ratio computed from it (sentences per CPU second)
    cpu_seconds: float | None = None
    cpu_speed_ratio: float | None = None

    @property
    def batching(self) -> str:
        return "batch 1" if self.max_sentences == 1 else (f"<= {self.max_sentences} sent." if self.max_sentences
                                                         else f"<= {self.max_tokens} tok")


@dataclass
class TimedPass:
    hypotheses: list[str]
    generated: int  # target tokens incl. eos
    iterations: list[int | None]
    batch_sizes: list[int] = field(default_factory=list)
    seconds: float = 0.0
    cpu_seconds: float = 0.0


def default_runs_dir() -> Path:
    """Where train.py writes runs: ``$SEQMIX_LOG_DIR/runs`` or ``<repo>/outputs/runs`` (conf/paths)."""
    return Path(os.environ.get("SEQMIX_LOG_DIR", REPO_ROOT / "outputs")) / "runs"


def default_data_dir() -> Path:
    return Path(os.environ.get("SEQMIX_DATA_DIR", REPO_ROOT.parent / "shared" / "data")) / "multi30k"


def is_nat_config(cfg: dict) -> bool:
    """A DisCo / CMLM run config (non-autoregressive task or model)."""
    module = str(((cfg.get("task") or {}).get("module") or {}).get("_target_", ""))
    model = str((cfg.get("model") or {}).get("_target_", ""))
    return "NonAutoregressive" in module or model.startswith("seqmix.models.nat.")


def checkpoint_info(path: Path) -> dict | None:
    """{"task", "model", "nat"} stored in a seqmix checkpoint; None when unreadable / not a seqmix checkpoint."""
    try:
        cfg = torch.load(path, map_location="cpu", weights_only=False, mmap=True)["seqmix"]["config"]
        return {"task": str(cfg["task"]["name"]), "model": str(cfg["model"]["name"]), "nat": is_nat_config(cfg)}
    except Exception:
        return None


def checkpoint_meta(path: Path) -> tuple[str | None, str | None]:
    """(task name, model name) stored in a seqmix checkpoint; Nones when unreadable / not a seqmix checkpoint."""
    info = checkpoint_info(path)
    return (None, None) if info is None else (info["task"], info["model"])


def _given_or_found(ckpt, runs_dir, nat: bool, log) -> list | None:
    """The checkpoints passed (one path or a list), else the newest found under the runs folders; None, after
    saying how to make one, when there are none."""
    if ckpt is not None:
        return [ckpt] if isinstance(ckpt, (str, Path)) else list(ckpt)
    found = find_checkpoints(runs_dir, nat=nat)
    if not found:
        where = ', '.join(map(str, _runs_dirs(runs_dir)))
        if nat:
            log(f"nat: no DisCo/CMLM {TASK_NAME} checkpoint under {where}; skipped. Make one: {HOW_TO_TRAIN_NAT}")
        else:
            log(f"decoding: no autoregressive {TASK_NAME} checkpoint under {where}; skipped. "
                f"Make one with:\n    {HOW_TO_TRAIN}")
        return None
    return found


def _runs_dirs(runs_dir) -> list[Path]:
    if runs_dir is None:
        return [default_runs_dir()]
    return [Path(runs_dir)] if isinstance(runs_dir, (str, Path)) else [Path(d) for d in runs_dir]


def _model_order(nat: bool) -> Callable[[str], tuple]:
    if nat:  # DisCo (the paper's model) first, then CMLM (its baseline), then anything else
        return lambda m: (not m.startswith("disco"), not m.startswith("cmlm"), m)
    return lambda m: (not m.startswith("transformer"), m)  # the baseline of the speed ratios first


def find_checkpoints(runs_dir: Path | list[Path] | None = None, task: str = TASK_NAME, nat: bool = False
                     ) -> list[Path]:
    """The newest ``<runs_dir>/*/checkpoints/best.ckpt`` trained on ``task`` for each model name: autoregressive
    models (Transformer first, the baseline of the speed ratios), or with ``nat`` the DisCo / CMLM ones (DisCo
    first). ``runs_dir`` may be a list of folders."""
    candidates = [p for d in _runs_dirs(runs_dir) for p in d.glob("*/checkpoints/best.ckpt")]
    candidates.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    newest: dict[str, Path] = {}
    for path in candidates:
        info = checkpoint_info(path)
        if info is not None and info["task"] == task and info["nat"] == nat:
            newest.setdefault(info["model"], path)
    return [newest[m] for m in sorted(newest, key=_model_order(nat))]


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# ----------------------------------------------------------------------------------------------- decoding

Generate = Callable[[torch.Tensor], list[tuple[torch.Tensor | None, int, int | None]]]


def beam_generate(model, search) -> Generate:
    """Per source: (best hypothesis' tokens incl. eos, their count, None)."""
    def generate(src_tokens):
        return [(h[0].tokens, len(h[0].tokens), None) if h else (None, 0, None)
                for h in search.generate(model, src_tokens)]

    return generate


def nat_generate(model, decoder) -> Generate:
    """Per source: (chosen candidate's tokens, their count + eos, decoder passes spent on it)."""
    def generate(src_tokens):
        result = decoder.generate(model, src_tokens)
        return [(t, len(t) + 1, n) for t, n in zip(result.tokens, result.iterations.tolist())]

    return generate


def timed_decode(tokenizer, dataset, generate: Generate, max_tokens: int, device: torch.device,
                 max_sentences: int | None = None) -> TimedPass:
    """Decode ``dataset`` in ``generate.py``'s batches (token budget, sorted by length, at most ``max_sentences``
    per batch); everything from batching to detokenized text is timed."""
    from seqmix.data import TokenBudgetBatchSampler, collate_pairs

    sampler = TokenBudgetBatchSampler(dataset.src_sizes, dataset.tgt_sizes, max_tokens=max_tokens,
                                      max_sentences=max_sentences, shuffle=False)
    out = TimedPass([""] * len(dataset), 0, [None] * len(dataset))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for batch_idx in sampler:
            batch = collate_pairs([dataset[i] for i in batch_idx], tokenizer.pad, tokenizer.bos, tokenizer.eos)
            out.batch_sizes.append(len(batch_idx))
            for i, (tokens, count, n_iter) in zip(batch["id"].tolist(), generate(batch["src_tokens"].to(device))):
                if tokens is not None:
                    out.generated += count
                    out.hypotheses[i] = tokenizer.decode(tokens.tolist())
                out.iterations[i] = n_iter
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    out.seconds, out.cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return out


@dataclass
class Loaded:
    """A checkpoint's task on the device and the val set it is benchmarked on."""

    task: object
    cfg: object
    dataset: object  # PairDataset of the val sources (no targets)
    refs: list[str]
    bleu_opts: dict
    info: dict


def load_checkpoint_and_data(ckpt: Path, limit: int | None, device: torch.device, data_dir: str | Path | None,
                             log=print) -> Loaded:
    from omegaconf import OmegaConf

    from seqmix.cli.generate import load_task
    from seqmix.data import LocalParallelSource, PairDataset
    from seqmix.models import count_parameters

    task, train_cfg = load_task(str(ckpt))
    name = train_cfg.task.name
    if name != TASK_NAME:
        log(f"decoding: warning: {ckpt} was trained on task {name!r}, not {TASK_NAME!r}; BLEU will be meaningless")
    task.to(device)
    tokenizer = task.tokenizer
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
    dataset = PairDataset.from_lists(src_ids, [[] for _ in src_ids], src_texts, ref_texts)
    refs = [tokenizer.normalize_reference(r) for r in ref_texts]
    gen_opts = dict(OmegaConf.to_container(train_cfg.task.generation, resolve=True))
    bleu_opts = dict(OmegaConf.to_container(train_cfg.task.bleu, resolve=True))
    info = {"ckpt": str(ckpt), "task": name, "model": str(train_cfg.model.name),
            "parameters": count_parameters(task.model), "data": str(data_path), "split": "val", "device": str(device),
            "torch_threads": torch.get_num_threads(), "generation": gen_opts}
    nat = getattr(task, "nat", None)
    if nat is not None:
        info["nat"] = dict(nat)
    return Loaded(task, train_cfg, dataset, refs, bleu_opts, info)


def _subset(dataset, n: int):
    from seqmix.data import PairDataset

    n = min(n, len(dataset))
    return PairDataset.from_lists(dataset.src.tolist()[:n], dataset.tgt.tolist()[:n], dataset.src_texts[:n],
                                  dataset.tgt_texts[:n])


def measure(loaded: Loaded, generate: Generate, max_tokens: int, device: torch.device,
            max_sentences: int | None = None, sentences: int | None = None) -> DecodeResult:
    """A warm-up pass over a few sentences (untimed), then one timed pass over the first ``sentences`` (all by
    default) with the same batching; BLEU of that output."""
    from seqmix.metrics import corpus_bleu

    data = loaded.dataset if sentences is None else _subset(loaded.dataset, sentences)
    tok = loaded.task.tokenizer
    timed_decode(tok, _subset(data, WARMUP_SENTENCES), generate, max_tokens, device, max_sentences)
    res = timed_decode(tok, data, generate, max_tokens, device, max_sentences)
    bleu = corpus_bleu(res.hypotheses, loaded.refs[:len(data)], **loaded.bleu_opts)
    elapsed = max(res.seconds, 1e-9)
    its = [n for n in res.iterations if n is not None]
    return DecodeResult(loaded.info["model"], loaded.info["parameters"], None, len(data), res.seconds,
                        len(data) / elapsed, res.generated / elapsed, bleu.score, bleu.signature, max_tokens,
                        max_sentences=max_sentences, batches=len(res.batch_sizes),
                        largest_batch=max(res.batch_sizes, default=0),
                        avg_iterations=sum(its) / len(its) if its else None, ckpt=loaded.info["ckpt"],
                        cpu_seconds=res.cpu_seconds if device.type == "cpu" else None)


# ----------------------------------------------------------------------------------------------- AR section

def run_decoding_benchmark(ckpt: str | Path | list | None = None, beams: tuple[int, ...] = (1, 5),
                           limit: int | None = None, max_tokens: int = 8000, device: str = "auto",
                           data_dir: str | Path | None = None, runs_dir=None, log=print) -> dict | None:
    """Speed and BLEU per (autoregressive checkpoint, beam); None (after saying how to make a checkpoint) when
    there is none. ``ckpt``: one path, a list, or None for :func:`find_checkpoints`."""
    ckpts = _given_or_found(ckpt, runs_dir, nat=False, log=log)
    if ckpts is None:
        return None
    infos, rows = [], []
    for path in ckpts:
        res = decode_checkpoint(Path(path), beams, limit, max_tokens, device, data_dir, log)
        infos.append(res["info"])
        rows.extend(res["rows"])
    add_speed_ratios(rows)
    return {"info": infos, "rows": rows}


def add_speed_ratios(rows: list[DecodeResult]) -> None:
    """Against the first Transformer row with the same beam and batching (or the first model's, without one)."""
    models = list(dict.fromkeys(r.model for r in rows))
    base_model = next((m for m in models if m.startswith("transformer")), models[0] if models else None)
    base: dict = {}
    for r in rows:
        if r.model == base_model:
            base.setdefault((r.beam, r.max_sentences), r)
    for r in rows:
        b = base.get((r.beam, r.max_sentences))
        r.speed_ratio = r.sentences_per_s / b.sentences_per_s if b and b.sentences_per_s else None
        r.cpu_speed_ratio = _cpu_ratio(r, b)


def _cpu_ratio(row: DecodeResult, base: DecodeResult | None) -> float | None:
    """Sentences per CPU second over the baseline's (None without CPU times)."""
    if base is None or not row.cpu_seconds or not base.cpu_seconds:
        return None
    return (row.sentences / row.cpu_seconds) / (base.sentences / base.cpu_seconds)


def decode_checkpoint(ckpt: Path, beams: tuple[int, ...], limit: int | None, max_tokens: int, device: str,
                      data_dir: str | Path | None, log=print, max_sentences: int | None = None) -> dict:
    """One autoregressive checkpoint: {"info", "rows"} with a row per beam size."""
    dev = _device(device)
    loaded = load_checkpoint_and_data(ckpt, limit, dev, data_dir, log)
    if loaded.info.get("nat") is not None:
        raise SeqmixError(f"{ckpt} is a non-autoregressive model ({loaded.info['model']}); it has no beam search: "
                          "decode it with --nat-ckpt (python -m benchmarks.run --only nat)")
    info = loaded.info
    log(f"decoding: {ckpt} ({info['model']}, {info['parameters']:,} parameters), {len(loaded.dataset)} val sentences")
    rows = []
    for beam in beams:
        search = loaded.task.beam_search(beam_size=int(beam))  # as generate.py: the checkpoint's settings + beam
        row = measure(loaded, beam_generate(loaded.task.model, search), max_tokens, dev, max_sentences)
        row.beam = int(beam)
        rows.append(row)
        log(f"  beam {beam}: {row.sentences_per_s:.1f} sentences/s ({row.seconds:.1f}s), BLEU {row.bleu:.2f}")
    return {"info": info, "rows": rows}


def format_table(rows: list[DecodeResult]) -> str:
    header = ["model", "params", "beam", "sentences", "seconds", "sent/s", "tok/s", "BLEU", "speed x", "cpu x"]
    lines = [[r.model, f"{r.parameters / 1e6:.1f}M", str(r.beam), str(r.sentences), f"{r.seconds:.1f}",
              f"{r.sentences_per_s:.1f}", f"{r.tokens_per_s:.0f}", f"{r.bleu:.2f}",
              "-" if r.speed_ratio is None else f"{r.speed_ratio:.2f}",
              "-" if r.cpu_speed_ratio is None else f"{r.cpu_speed_ratio:.2f}"] for r in rows]
    return _render(header, lines)


def _render(header: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]

    def render(cells):
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths))

    return "\n".join([render(header), "  ".join("-" * w for w in widths), *(render(line) for line in lines)])


def as_dicts(rows: list[DecodeResult]) -> list[dict]:
    return [asdict(r) | {"batching": r.batching} for r in rows]


# ----------------------------------------------------------------------------------------------- NAT section

def default_teacher(runs_dir=None, log=print) -> Path | None:
    """The newest Multi30k Transformer checkpoint (the NAT recipes' distillation teacher)."""
    ar = [p for p in find_checkpoints(runs_dir) if (checkpoint_meta(p)[1] or "").startswith("transformer")]
    if not ar:
        log(f"nat: no autoregressive Transformer {TASK_NAME} checkpoint to compare with (--nat-teacher PATH); "
            "NAT rows get no speed ratio")
        return None
    return ar[0]


def nat_settings(task, length_beam: int | None = None, max_iterations: int | None = None):
    """The checkpoint's decoder (task.nat: algorithm, length beam, max iterations) with the given overrides, as
    ``generate.py length_beam=... max_iterations=...`` builds it."""
    overrides = {k: v for k, v in (("length_beam", length_beam), ("max_iterations", max_iterations))
                 if v is not None}
    return task.decoder_settings(**overrides)


def run_nat_benchmark(nat_ckpt: str | Path | list | None = None, teacher: str | Path | None = None,
                      teacher_beam: int = 5, limit: int | None = None, batch1_limit: int | None = 200,
                      max_tokens: int = 8000, device: str = "auto", data_dir: str | Path | None = None,
                      runs_dir=None, length_beam: int | None = None, max_iterations: int | None = None,
                      log=print) -> dict | None:
    """DisCo / CMLM checkpoints and their teacher (beam ``teacher_beam``), each at batch size 1 (first
    ``batch1_limit`` of the sentences) and at full ``max_tokens`` batches (``limit`` sentences, all by default);
    None (after saying how to make one) when there is no NAT checkpoint.

    Rows are ordered batching first (batch 1, then full), the teacher first within each; ``speed x`` is a row's
    sentences/s over the teacher's at the same batching (None without a teacher)."""
    dev = _device(device)
    nat_ckpts = _given_or_found(nat_ckpt, runs_dir, nat=True, log=log)
    if nat_ckpts is None:
        return None
    teacher = Path(teacher) if teacher else default_teacher(runs_dir, log)
    # (max_sentences, how many of the first val sentences): the dataset is already cut at ``limit``
    batchings = [(1, batch1_limit or None), (None, None)]
    models = ([("teacher", teacher)] if teacher is not None else []) + [("nat", p) for p in nat_ckpts]
    for role, path in models:  # before decoding anything
        meta = checkpoint_info(Path(path))
        if meta is not None and meta["nat"] != (role == "nat"):
            raise SeqmixError(f"{path} is {'a non-' if meta['nat'] else 'an '}autoregressive model ({meta['model']}); "
                              f"pass it as {'--nat-ckpt' if meta['nat'] else '--nat-teacher'}")
    infos, rows = [], []
    for role, path in models:
        loaded = load_checkpoint_and_data(Path(path), limit, dev, data_dir, log)
        is_nat = role == "nat"
        if is_nat:
            decoder = nat_settings(loaded.task, length_beam, max_iterations)
            generate = nat_generate(loaded.task.model, decoder)
            loaded.info["decoder"] = {"algorithm": decoder.algorithm, "length_beam": decoder.length_beam,
                                      "max_iterations": decoder.max_iterations}
        else:
            generate = beam_generate(loaded.task.model, loaded.task.beam_search(beam_size=int(teacher_beam)))
            loaded.info["decoder"] = {"beam_size": int(teacher_beam)}
        loaded.info["role"] = role
        infos.append(loaded.info)
        log(f"nat: {path} ({loaded.info['model']}, {role}, {loaded.info['parameters']:,} parameters)")
        for max_sentences, n in batchings:
            row = measure(loaded, generate, max_tokens, dev, max_sentences, n)
            row.role = role
            if is_nat:
                row.decoder, row.length_beam, row.max_iterations = (decoder.algorithm, decoder.length_beam,
                                                                    decoder.max_iterations)
            else:
                row.beam = int(teacher_beam)
            rows.append(row)
            its = "" if row.avg_iterations is None else f", {row.avg_iterations:.2f} iterations"
            log(f"  {row.batching}: {row.sentences} sentences, {row.sentences_per_s:.1f} sentences/s, "
                f"BLEU {row.bleu:.2f}{its}")
    rows.sort(key=lambda r: r.max_sentences is None)  # stable: batch 1 first, the teacher first within each
    add_teacher_ratios(rows)
    return {"info": infos, "rows": rows}


def add_teacher_ratios(rows: list[DecodeResult]) -> None:
    """speed x = sentences/s over the teacher row's with the same batching (max_sentences); None without one."""
    base = {}
    for r in rows:
        if r.role == "teacher":
            base.setdefault(r.max_sentences, r)
    for r in rows:
        b = base.get(r.max_sentences)
        if b is not None and b.sentences != r.sentences:
            raise ValueError(f"{r.model} ({r.batching}) decoded {r.sentences} sentences, the teacher {b.sentences}: "
                             "ratios need the same sentences")
        r.speed_ratio = r.sentences_per_s / b.sentences_per_s if b is not None and b.sentences_per_s else None
        r.cpu_speed_ratio = _cpu_ratio(r, b)


def format_nat_table(rows: list[DecodeResult]) -> str:
    header = ["model", "decoder", "batching", "sentences", "batches", "seconds", "sent/s", "speed x", "cpu x",
              "BLEU", "avg iter", "len beam", "max iter"]

    def f(v, spec=""):
        return "-" if v is None else format(v, spec)

    lines = [[r.model, f"beam {r.beam}" if r.decoder == "beam" else r.decoder, r.batching, str(r.sentences),
              str(r.batches), f"{r.seconds:.1f}", f"{r.sentences_per_s:.1f}", f(r.speed_ratio, ".2f"),
              f(r.cpu_speed_ratio, ".2f"), f"{r.bleu:.2f}", f(r.avg_iterations, ".2f"), f(r.length_beam), f(r.max_iterations)] for r in rows]
    return _render(header, lines)
