"""Training updates of a WMT'16 En-De model at the paper's size, on random token ids of WMT-like lengths: what the big
configs cost in tokens/s and memory without the 4.5M-pair corpus. The batches are synthetic (``random_batches``:
sentence lengths drawn from a log-normal around 27 subwords, WMT'14 En-De's mean under a 32K joint BPE, cut at 250,
batched by length as the token-budget sampler batches them), the
model, loss and optimizer are the preset's own (``build_task``, ``compute_loss``, ``configure_optimizers``)."""

from __future__ import annotations

import contextlib
import math
import statistics
import time

import torch

from benchmarks import common

FIELDS = ("preset model parameters precision compile updates sentences_per_update tgt_tokens_per_update ms_per_update "
          "tokens_per_s flops_per_tgt_token tflops_per_s mfu peak_mem_mb first_loss final_loss status")
MEAN_LENGTH, MAX_LENGTH = 27, 250


def synthetic_tokenizer(vocab_size: int):
    """A word-level tokenizer of exactly ``vocab_size`` ids (specials included)."""
    from seqmix.data.tokenizer import SPECIALS, train_word_tokenizer

    words = " ".join(f"w{i}" for i in range(vocab_size - len(SPECIALS)))
    return train_word_tokenizer([words], vocab_size, min_frequency=1)


def random_batches(tokenizer, max_tokens: int, count: int, device: torch.device, seed: int = 0) -> list[dict]:
    """``count`` batches as the token-budget sampler and the collate function lay them out: pairs of similar length
    (drawn, sorted by length, cut into batches of at most ``max_tokens`` padded tokens a side, ``count`` of them taken
    at random); right-padded source; target ending in eos; ``prev_output_tokens`` the target shifted right behind
    bos."""
    from seqmix.data.tokenizer import SPECIALS

    g = torch.Generator().manual_seed(seed)
    low = len(SPECIALS)  # ids below are the specials
    lengths = torch.empty(count * max_tokens // 8, 2).log_normal_(mean=math.log(MEAN_LENGTH) - 0.18, std=0.6,
                                                                  generator=g)
    pairs = sorted((int(min(max(a, 2), MAX_LENGTH)), int(min(max(b, 2), MAX_LENGTH))) for a, b in lengths.tolist())
    pairs.sort(key=lambda p: (max(p[0], p[1] + 1), p))
    groups, group = [], []
    for pair in pairs:
        longest = max([max(a, b + 1) for a, b in group] + [max(pair[0], pair[1] + 1)])
        if group and longest * (len(group) + 1) > max_tokens:
            groups.append(group)
            group = []
        group.append(pair)
    groups.append(group)
    batches = []
    for k in torch.randperm(len(groups), generator=g)[:count].tolist():
        group = groups[k]
        S, T = max(a for a, _ in group), max(b for _, b in group) + 1
        src = torch.full((len(group), S), tokenizer.pad)
        tgt = torch.full((len(group), T), tokenizer.pad)
        prev = torch.full((len(group), T), tokenizer.pad)
        for i, (a, b) in enumerate(group):
            src[i, :a] = torch.randint(low, tokenizer.vocab_size, (a,), generator=g)
            words = torch.randint(low, tokenizer.vocab_size, (b,), generator=g)
            tgt[i, :b], tgt[i, b] = words, tokenizer.eos
            prev[i, 0], prev[i, 1:b + 1] = tokenizer.bos, words
        batches.append({"src_tokens": src.to(device), "prev_output_tokens": prev.to(device), "target": tgt.to(device),
                        "ntokens": sum(b + 1 for _, b in group), "nsentences": len(group)})
    return batches


def measure(overrides: list[str], device: torch.device, updates: int = 30, warmup: int = 5) -> dict:
    """``warmup`` untimed then ``updates - warmup`` timed updates (forward, backward, optimizer step) in the config's
    ``trainer.precision`` (16-mixed with a gradient scaler, as Lightning runs it)."""
    from benchmarks.training import batch_flops_per_target_token
    from seqmix.config.build import build_task
    from seqmix.models import count_parameters

    cfg = common.compose_train(overrides)
    precision = str(cfg.trainer.precision)
    tokenizer = synthetic_tokenizer(int(cfg.task.vocab_size))
    torch.manual_seed(0)
    task = build_task(cfg, tokenizer).to(device)
    batches = random_batches(tokenizer, int(cfg.task.data.max_tokens), 8, device)
    flops = batch_flops_per_target_token(task, batches[0])
    task.trainer = None
    optimizer = torch.optim.Adam(task.parameters(), lr=1e-5)  # the step's cost is Adam's whatever the preset's lr
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    losses, times = [], []
    for k in range(updates):
        batch = batches[k % len(batches)]
        start = time.perf_counter()
        autocast = torch.autocast(device.type, dtype) if dtype else contextlib.nullcontext()
        with autocast:
            loss, _, ntokens = task.compute_loss(batch)
        scaler.scale(loss / ntokens).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()) / ntokens)  # synchronizes
        times.append((time.perf_counter() - start, batch["ntokens"], batch["nsentences"]))
    wall, tokens, sentences = zip(*times[warmup:])
    tokens_per_s = statistics.median(n / t for n, t in zip(tokens, wall))
    return common.new_row(
        FIELDS, preset=" ".join(overrides), model=str(cfg.model.name), parameters=count_parameters(task.model),
        precision=precision, compile=bool(cfg.get("compile")), updates=len(wall),
        sentences_per_update=statistics.fmean(sentences), tgt_tokens_per_update=statistics.fmean(tokens),
        ms_per_update=1000 * statistics.median(wall), tokens_per_s=tokens_per_s, flops_per_tgt_token=flops,
        tflops_per_s=flops * tokens_per_s / 1e12, first_loss=losses[0], final_loss=losses[-1],
        peak_mem_mb=torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None, status="ok")
