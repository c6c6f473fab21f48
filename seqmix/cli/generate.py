"""`python generate.py`: rebuild a task from its checkpoint and run it on a split or a file: decode and score
(translation: BLEU, summarization: ROUGE) or measure perplexity (language modeling; with decoding options it
continues the lines). The task's ``decode_outputs`` gives each input's hypotheses (n-best, samples, forced
prefixes), which this module writes as ``output_format`` says: text, jsonl or fairseq-generate's lines."""

from __future__ import annotations

import gzip
import inspect
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from seqmix.cli.score_reference import check_score_reference, score_references
from seqmix.config.download import suggest_download
from seqmix.config.ensemble import load_checkpoints
from seqmix.config.schema import check_generate_config
from seqmix.data.distilled import write_distilled
from seqmix.errors import SeqmixError
from seqmix.files import atomic_write_text
from seqmix.generation.decode import TextHypothesis
from seqmix.generation.options import DECODING_OPTIONS, DecodeRequest, SamplingOptions
from seqmix.models import count_parameters
from seqmix.models.compiled import check_decoding_setting
from seqmix.models.quantized import check_quantize, quantize_int8, quantized_linears
from seqmix.tasks import SummarizationTask, TranslationTask
from seqmix.training.run_record import RECORD, record_evaluation

# generate.yaml keys handed to the task when set (null keeps what the model was trained with): the decoding
# algorithms' options, and language modeling's context
OVERRIDE_KEYS = (*DECODING_OPTIONS, "eval_context")
DEFAULT_METRICS = ("chrf", "ter")  # metrics=null on a translation task
SAMPLING_KEYS = ("top_k", "top_p", "temperature", "seed")


def decode_request(cfg: DictConfig) -> DecodeRequest:
    """nbest / sampling / prefix_size from the command line; sampling's keys without sampling=true are a mistake."""
    sampling = None
    if cfg.get("sampling"):
        sampling = SamplingOptions(**{k: cfg[k] for k in SAMPLING_KEYS if cfg.get(k) is not None})
    else:
        given = [k for k in SAMPLING_KEYS if cfg.get(k) is not None]
        if given:
            raise SeqmixError(f"{', '.join(given)} shape sampling: add sampling=true (or drop them for beam search)")
    request = DecodeRequest(int(cfg.get("nbest") or 1), sampling, int(cfg.get("prefix_size") or 0))
    if cfg.input == "-" and (request.nbest > 1 or cfg.get("output_format", "text") != "text"):
        raise SeqmixError("input=- prints one line per input line: use nbest=1 output_format=text there, or "
                          "input=<file> for n-best lists and other formats")
    return request


def request_setting(request: DecodeRequest) -> dict:
    """``decoding_settings``'s keyword for ``request``: none for plain decoding, which every task describes."""
    return {} if request.plain else {"request": request}


def format_outputs(fmt: str, sources: list[str], refs: list[list[str]] | None,
                   outputs: list[list[TextHypothesis]]) -> str:
    """The hypotheses file. text: each hypothesis on its own line (nbest lines per input, best first); jsonl: one
    object per input; fairseq: fairseq-generate's S/T/H/D/P lines (scores in nats, H the vocabulary pieces)."""
    if fmt == "text":
        return "".join(h.text + "\n" for hyps in outputs for h in hyps)
    lines = []
    for i, (source, hyps) in enumerate(zip(sources, outputs)):
        ref = refs[i][0] if refs is not None and refs[i] else None
        if fmt == "jsonl":
            record = {"id": i, "source": source, **({"reference": ref} if ref is not None else {}),
                      "hypotheses": [{"text": h.text, "score": h.score, "positional_scores": h.positional_scores}
                                     for h in hyps]}
            lines.append(json.dumps(record, ensure_ascii=False))
            continue
        lines.append(f"S-{i}\t{source}")
        if ref is not None:
            lines.append(f"T-{i}\t{ref}")
        for h in hyps:
            score = "nan" if h.score is None else f"{h.score:.6f}"
            pieces = " ".join(h.pieces) if h.pieces is not None else h.text
            lines.append(f"H-{i}\t{score}\t{pieces}")
            lines.append(f"D-{i}\t{score}\t{h.text}")
            if h.positional_scores is not None:
                lines.append(f"P-{i}\t{' '.join(f'{x:.4f}' for x in h.positional_scores)}")
    return "".join(line + "\n" for line in lines)


def _read_lines(path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise SeqmixError(f"input file {p} does not exist")
    opener = gzip.open if p.suffix == ".gz" else open
    lines: list[str] = []
    try:
        with opener(p, "rb") as f:
            for raw in f:  # line by line, so that a decoding error names its line
                lines.append(raw.decode("utf-8").rstrip("\n").rstrip("\r"))
    except UnicodeDecodeError as err:
        raise SeqmixError(f"input file {p} is not UTF-8 text (line {len(lines) + 1}: {err.reason}); "
                          "convert it (iconv -t UTF-8) or point input= at the text to translate") from None
    except (gzip.BadGzipFile, EOFError) as err:
        raise SeqmixError(f"input file {p} is not a valid gzip file ({err}); "
                          "decompress it or give the plain text") from None
    return lines


def read_inputs(cfg: DictConfig, train_cfg: DictConfig) -> tuple[list[str], list[list[str]] | None]:
    """Inputs and their reference sets (None when there is nothing to compare with)."""
    if cfg.input:
        src = _read_lines(cfg.input)
        refs = _read_lines(cfg.reference) if cfg.reference else None
        if refs is not None and len(refs) != len(src):
            raise SeqmixError(f"{cfg.input} has {len(src)} lines but {cfg.reference} has {len(refs)}")
        return src, None if refs is None else [[r] for r in refs]
    splits = train_cfg.task.data.splits
    split_name = splits.get(cfg.split)
    if split_name is None:
        have = [k for k, v in splits.items() if v is not None]
        raise SeqmixError(f"task {train_cfg.task.name} has no '{cfg.split}' split; choose split= one of {have} "
                          "or pass input=<file>")
    source_cfg = OmegaConf.merge(train_cfg.task.data.source, cfg.data or {})
    with suggest_download(train_cfg.task):
        corpus = instantiate(source_cfg).read(split_name)
    return corpus.inputs(), corpus.reference_sets()


def distill(cfg: DictConfig, train_cfg: DictConfig, sources: list[str], outputs: list[str]) -> None:
    """Write the split's sources and their translations as a local dataset (``DistilledTrainSource`` reads it)."""
    data = train_cfg.task.data
    files = write_distilled(cfg.distill_dir, data.splits[cfg.split], data.src_lang, data.tgt_lang, sources, outputs)
    print(f"distilled data: {', '.join(str(f) for f in files)}")


def decoding_device(name: str) -> torch.device:
    """``auto``: the GPU when there is one; an explicit device must exist here."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as err:
        raise SeqmixError(f"device={name} is not usable here ({_first_line(err)}); use device=auto or cpu") from None
    return device


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def interactive(task, train_cfg: DictConfig, max_tokens: int, overrides: dict, request: DecodeRequest) -> None:
    """``input=-``: translate (summarize; a language model given decoding options: continue) each stdin line as soon
    as it arrives, one output line per input line on stdout, flushed (fairseq-interactive); the same tokenizer and
    decoding settings as a file. Ends at end of input."""
    from seqmix.tasks.language_modeling import LanguageModelingTask

    if isinstance(task, LanguageModelingTask) and not task.continues(request, overrides):
        raise SeqmixError(f"input=- decodes text, and {train_cfg.task.name} is a language model: score a file with "
                          "input=<file>, or continue each line with decoding options (sampling=true, beam_size=...)")
    print(f"model: {train_cfg.model.name}, task {train_cfg.task.name}: reading lines from stdin", file=sys.stderr,
          flush=True)
    for line in iter(sys.stdin.readline, ""):
        source = line.rstrip("\r\n")
        text = ""
        if source.strip():
            hyps = task.decode_outputs([source], None, max_tokens, request=request, **overrides)[0][0]
            text = hyps[0].text if hyps else ""
        print(text, flush=True)


def set_paper_bleu(task, kinds) -> None:
    """``paper_bleu=<kind or list>``: the papers' BLEU to print beside sacreBLEU, instead of the task's
    ``task.bleu.paper`` (null keeps that)."""
    if kinds is None:
        return
    if not isinstance(task, TranslationTask) or isinstance(task, SummarizationTask):
        raise SeqmixError(f"paper_bleu= scores translations; {type(task).__name__} reports no BLEU: drop it")
    task.bleu = replace(task.bleu, paper=OmegaConf.to_container(kinds) if OmegaConf.is_list(kinds) else kinds)


def set_extra_metrics(task, names) -> None:
    """``metrics=[chrf, ter]``: sacreBLEU's chrF / chrF++ / TER printed (and recorded) beside BLEU; null: chrF and TER
    for translation, nothing for the other tasks."""
    translation = isinstance(task, TranslationTask) and not isinstance(task, SummarizationTask)
    names = (list(DEFAULT_METRICS) if translation else []) if names is None else list(names)
    if names and not translation:
        raise SeqmixError(f"metrics={names} score translations; {type(task).__name__} reports no BLEU: use metrics=[]")
    task.extra_metrics = tuple(names)


def options_given(overrides: dict, request: DecodeRequest) -> list[str]:
    """The decoding options the command line set (``max_sentences`` only batches)."""
    return [*(k for k in overrides if k != "max_sentences"), *(["nbest"] if request.nbest > 1 else []),
            *(["sampling"] if request.sampling else []), *(["prefix_size"] if request.prefix_size else [])]


def print_decoding_settings(task, overrides: dict, request: DecodeRequest, stream) -> None:
    """One line: what the task decodes with, and which of it the command line set (the rest is the checkpoint's
    task settings). On stderr for input=-, whose stdout holds only the outputs."""
    settings = task.decoding_settings(**overrides, **request_setting(request))
    if not settings:
        return
    names = options_given(overrides, request)
    given = f"; from the command line: {', '.join(names)}" if names else ""
    print(f"decoding: {settings} (the checkpoint's task settings{given})", file=stream, flush=True)


def print_ensemble(ckpt_path, stream) -> None:
    """An ensemble says so, and whose settings it decodes with."""
    if OmegaConf.is_list(ckpt_path) and len(ckpt_path) > 1:
        print(f"ensemble of {len(ckpt_path)} checkpoints ({', '.join(map(str, ckpt_path))}): per-step log-probs "
              f"averaged; task, tokenizer and decoding settings from {ckpt_path[0]}", file=stream, flush=True)


def generate(cfg: DictConfig) -> float | None:
    check_generate_config(cfg)
    request = decode_request(cfg)
    check_score_reference(cfg, request)
    task, train_cfg = load_checkpoints(cfg.ckpt_path, cfg.average_last, cfg.get("average_updates", False))
    print_ensemble(cfg.ckpt_path, sys.stderr if cfg.input == "-" else sys.stdout)
    if cfg.get("distill_dir") and cfg.input:
        raise SeqmixError("distill_dir= writes a split of the task's data: use split=train, not input=")
    device = decoding_device(cfg.device)
    task.to(device)
    parameters = count_parameters(task.model)  # before int8 packs the Linear weights out of .parameters()
    if check_quantize(cfg.get("quantize"), device):
        task.model = quantize_int8(task.model)
        print(f"quantize=int8: {quantized_linears(task.model)} Linear layers in int8 (dynamic), embeddings and output "
              "projection float32", file=sys.stderr if cfg.input == "-" else sys.stdout, flush=True)
    task.compile_decoding = check_decoding_setting(cfg.get("compile_decoding", False))
    set_paper_bleu(task, cfg.get("paper_bleu"))
    set_extra_metrics(task, cfg.get("metrics"))
    overrides = {k: cfg[k] for k in OVERRIDE_KEYS if cfg.get(k) is not None}
    print_decoding_settings(task, overrides, request, sys.stderr if cfg.input == "-" else sys.stdout)
    if cfg.get("max_sentences"):
        if "max_sentences" not in inspect.signature(task.decode_outputs).parameters:
            raise SeqmixError(f"max_sentences= does not apply to {type(task).__name__}")
        overrides["max_sentences"] = int(cfg.max_sentences)
    if cfg.input == "-":
        return interactive(task, train_cfg, int(cfg.max_tokens), overrides, request)
    sources, refs = read_inputs(cfg, train_cfg)
    if cfg.get("score_reference"):
        return score_references(cfg, task, sources, refs, overrides)
    start = time.perf_counter()
    outputs, report = task.decode_outputs(sources, refs, int(cfg.max_tokens), request=request, **overrides)
    elapsed = time.perf_counter() - start
    print(f"model: {train_cfg.model.name} ({parameters:,} parameters), task {train_cfg.task.name}")
    print(f"processed {len(sources)} inputs in {elapsed:.1f}s ({len(sources) / max(elapsed, 1e-9):.1f}/s)")
    if outputs is not None:
        out_path = Path(cfg.output)
        atomic_write_text(out_path, format_outputs(cfg.get("output_format", "text"), sources, refs, outputs))
        print(f"hypotheses: {out_path}")
        if cfg.get("distill_dir"):
            distill(cfg, train_cfg, sources, [hyps[0].text if hyps else "" for hyps in outputs])
    if report is None:
        return None
    print(report.headline)
    for line in report.details:
        print(line)
    record_in_run(cfg, task.decoding_settings(**overrides, **request_setting(request)), report,
                  options_given(overrides, request))
    return report.score


def record_in_run(cfg: DictConfig, decoding: str, report, options_given: list[str]) -> None:
    """A split of the task's own data scored from a run's checkpoint (``<run>/checkpoints/x.ckpt``) joins that run's
    record (``run.json``: ``evaluations``), which the results tables are written from."""
    if OmegaConf.is_list(cfg.ckpt_path):  # an ensemble is no one run's checkpoint
        return
    ckpt = Path(str(cfg.ckpt_path))
    if cfg.input or cfg.get("data") or ckpt.parent.name != "checkpoints":
        return
    run_dir = ckpt.parent.parent
    kind = " interval checkpoints" if cfg.get("average_updates") else ""
    checkpoint = ckpt.name + (f" (average of the last {cfg.average_last}{kind})" if cfg.average_last else "")
    if record_evaluation(run_dir, cfg.split, decoding, checkpoint, report.metrics, report.details, options_given):
        print(f"recorded in {run_dir / RECORD}")
