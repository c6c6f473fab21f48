"""Training throughput of the CPU recipes as ``train.py experiment=<task>_<name>_cpu`` trains them (config,
data module, task, a Lightning Trainer from the recipe's ``trainer`` config), a callback timing every optimizer update
(``training_step``, backward, clipping, optimizer step; not batch loading nor the lr-scheduler step)."""

from __future__ import annotations

import hashlib
import logging
import statistics
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch

from benchmarks import common
from benchmarks.plotting import bar_panels
from seqmix.errors import SeqmixError

BASELINE = "transformer_small"
DEFAULT_TASK = "multi30k"
RECIPES = (BASELINE, "lightconv_small", "dynamicconv_small", "talk_small", "convs2s_small", "disco_small", "cmlm_small")
FIELDS = ("model variant experiment parameters data max_tokens accumulate updates sentences_per_update "
          "tgt_tokens_per_update first_update_s ms_per_update ms_min ms_max tokens_per_s speed_ratio time_ratio "
          "variant_speed_ratio cpu_ms_per_update cpu_time_ratio flops_per_tgt_token gflops_per_s matmul_gflops_per_s "
          "matmul_fraction first_loss final_loss peak_mem_mb batch_digest status")


@dataclass
class Settings:
    models: tuple[str, ...] = RECIPES  # conf/experiment/<task>_<name without _small>_cpu.yaml; baseline added
    task: str = DEFAULT_TASK  # the recipes' prefix: multi30k, or dialogsum (400-token sources)
    warmup: int = 2
    repeats: int = 5
    max_tokens: int | None = None  # padded tokens per batch (default: the recipe's task.data.max_tokens)
    data_dir: str | None = None  # folder holding multi30k/ (default: the recipes' paths.data_dir)
    overrides: tuple[str, ...] = ()  # extra config overrides for every recipe, e.g. ("fused_loss=false",)
    # override sets each recipe is timed with, one row each, e.g. ((), ("compile=true",)): eager and compiled updates
    # of a recipe in adjacent rows of one run (variant_speed_ratio: over the recipe's first set)
    variants: tuple[tuple[str, ...], ...] = ((),)


QUICK = {"warmup": 1, "repeats": 2}


def experiment_of(model: str, task: str = DEFAULT_TASK) -> str:
    return f"{task}_{model.removesuffix('_small')}_cpu"


def compose_recipe(model: str, overrides=(), task: str = DEFAULT_TASK):
    """The run config ``train.py experiment=...`` gets (no logger, output folder pinned)."""
    experiment = experiment_of(model, task)
    if not (common.REPO_ROOT / "conf" / "experiment" / f"{experiment}.yaml").is_file():
        raise ValueError(f"no recipe conf/experiment/{experiment}.yaml for model {model!r}")
    return common.compose_train([f"experiment={experiment}", *overrides])


class UpdateTimer(L.Callback):
    """Per optimizer update: wall and CPU seconds, target tokens, sentences; the last loss; a digest of the batches."""

    def __init__(self, accumulate: int):
        self.accumulate, self.updates, self.loss, self.digest = accumulate, [], None, hashlib.sha1()
        self.first_loss = None

    def _now(self, module) -> list[float]:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)
        return [time.perf_counter(), time.process_time()]

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        if batch_idx % self.accumulate == 0:
            self.updates.append(self._now(module) + [0, 0])
        self.updates[-1][2:] = [self.updates[-1][2] + int(batch["ntokens"]), self.updates[-1][3] + int(batch["nsentences"])]
        for t in (batch["src_tokens"], batch["target"]):
            self.digest.update(str(tuple(t.shape)).encode() + t.cpu().numpy().tobytes())

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % self.accumulate == 0:
            self.updates[-1][:2] = [b - a for a, b in zip(self.updates[-1][:2], self._now(module))]
            self.loss = float(outputs["loss"])
            self.first_loss = self.loss if self.first_loss is None else self.first_loss


def measure(model: str, s: Settings, overrides: list[str], device: torch.device) -> dict:
    """``s.warmup`` untimed then ``s.repeats`` timed updates of the recipe, fitted as train.py fits it."""
    from hydra.utils import instantiate

    from seqmix.config.build import build_task
    from seqmix.models import count_parameters

    cfg = compose_recipe(model, overrides, s.task)
    accum, updates = int(cfg.trainer.get("accumulate_grad_batches") or 1), s.warmup + s.repeats
    dm = instantiate(cfg.task.data, _convert_="all")
    dm.setup("fit")
    torch.manual_seed(int(cfg.seed))
    task, timer = build_task(cfg, dm.tokenizer), UpdateTimer(accum)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with tempfile.TemporaryDirectory() as root, warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*(num_workers|does not have many workers|LeafSpec).*")
        instantiate(cfg.trainer, accelerator=device.type, devices=1, num_nodes=1, strategy="auto", max_epochs=-1,
                    max_steps=updates, limit_train_batches=updates * accum, max_time=None, limit_val_batches=0,
                    num_sanity_val_steps=0, logger=False, callbacks=[timer], enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, default_root_dir=root).fit(task, datamodule=dm)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None  # the fit's own
    wall, cpu, tokens, sentences = zip(*timer.updates[s.warmup:])
    flops_per_token = update_flops_per_target_token(task.to(device), dm, device)  # fit's teardown moved it to the CPU
    tokens_per_s = statistics.median(n / t for n, t in zip(tokens, wall))
    return common.new_row(
        FIELDS, model=str(cfg.model.name), experiment=experiment_of(model, s.task), parameters=count_parameters(task.model),
        first_update_s=timer.updates[0][0],  # with compile=true: the first compile too (steady time excludes it)
        data=f"{s.task} train ({cfg.task.data.source.path})", max_tokens=int(cfg.task.data.max_tokens), accumulate=accum,
        updates=len(wall), sentences_per_update=statistics.fmean(sentences), tgt_tokens_per_update=statistics.fmean(tokens),
        ms_per_update=1000 * statistics.median(wall), ms_min=1000 * min(wall), ms_max=1000 * max(wall),
        tokens_per_s=tokens_per_s, first_loss=timer.first_loss, final_loss=timer.loss, flops_per_tgt_token=flops_per_token,
        peak_mem_mb=peak,
        gflops_per_s=flops_per_token * tokens_per_s / 1e9,
        cpu_ms_per_update=1000 * statistics.median(cpu) if device.type == "cpu" else None,
        batch_digest=timer.digest.hexdigest()[:12], status="ok")


def update_flops_per_target_token(task, dm, device: torch.device) -> float:
    """Floating-point operations of one eager training update on the first training batch, per target token
    (:func:`batch_flops_per_target_token`)."""
    from lightning.pytorch.utilities import move_data_to_device

    return batch_flops_per_target_token(task, move_data_to_device(next(iter(dm.train_dataloader())), device))


def batch_flops_per_target_token(task, batch: dict) -> float:
    """Floating-point operations of one eager training update (forward + backward; torch's FlopCounterMode, which
    counts matmuls, convolutions and attention) on ``batch``, per target token: the arithmetic the timed updates do,
    whatever precision or compilation ran them. Counted with the loss unfused (the counter cannot see into the Triton
    loss kernel; the arithmetic is the same)."""
    from torch.utils import flop_counter

    aten = torch.ops.aten
    cpu_attention = {  # CPU's fused attention, which the counter does not know
        aten._scaled_dot_product_flash_attention_for_cpu:
            lambda q, k, v, *_, out_shape=None, **__: flop_counter.sdpa_flop_count(q, k, v),
        aten._scaled_dot_product_flash_attention_for_cpu_backward:
            lambda g, q, k, v, *_, out_shape=None, **__: flop_counter.sdpa_backward_flop_count(g, q, k, v)}
    compiled, task.compile_training = task.compile_training, False
    fused = getattr(task, "fused_loss", None)
    if fused is not None:
        task.fused_loss = False
    task.train()
    counter = flop_counter.FlopCounterMode(display=False, custom_mapping=cpu_attention)
    with counter:
        task.compute_loss(batch)[0].backward()
    task.zero_grad(set_to_none=True)
    task.compile_training = compiled
    if fused is not None:
        task.fused_loss = fused
    return counter.get_total_flops() / max(int(batch["ntokens"]), 1)


def matmul_gflops(device: torch.device, n: int = 1024, dtype: torch.dtype = torch.float32) -> float:
    """This machine's (n x n) @ (n x n) rate in this run: the roof an update's arithmetic is compared with."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    return 2 * n ** 3 / (statistics.median(common.time_ms(lambda: a @ b, 10, 3, device)) / 1e3) / 1e9


def run(s: Settings, device: torch.device, log=print) -> list[dict]:
    """A row per recipe and variant, baseline first; ERROR (raised) or FAILED (non-finite loss) rows get no numbers."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    overrides = [f"task.data.max_tokens={s.max_tokens}"] if s.max_tokens else []
    overrides += [f"paths.data_dir={Path(s.data_dir).resolve()}"] if s.data_dir else []
    overrides += list(s.overrides)
    rows, first = [], variant_name(s.variants[0])
    for model in dict.fromkeys((BASELINE, *s.models)):
        for extra in s.variants:
            rows.append(measure_row(model, s, [*overrides, *extra], device) | {"variant": variant_name(extra)})
            log(f"  {model} [{rows[-1]['variant']}]: {common.cell(rows[-1]['ms_per_update'], '.0f')} ms/update, "
                f"first update {common.cell(rows[-1]['first_update_s'], '.1f')} s, {rows[-1]['status']}")
    common.add_ratios(rows, lambda r: r["variant"], lambda r: r["model"] == BASELINE, speed_ratio="tokens_per_s",
                      time_ratio="ms_per_update", cpu_time_ratio="cpu_ms_per_update")
    common.add_ratios(rows, lambda r: r["experiment"], lambda r: r["variant"] == first,
                      variant_speed_ratio="tokens_per_s")
    roof = matmul_gflops(device)
    for row in rows:
        row["matmul_gflops_per_s"], row["matmul_fraction"] = roof, row["gflops_per_s"] / roof if common.ok(row) else None
    log(f"  fp32 1024x1024 matmul: {roof:.0f} GFLOP/s (matmul x: an update's GFLOP/s over it)")
    return rows


def variant_name(overrides: tuple[str, ...]) -> str:
    return " ".join(overrides) or "default"


def measure_row(model: str, s: Settings, overrides: list[str], device: torch.device) -> dict:
    """``measure``, or a row without numbers: FAILED (non-finite loss) or ERROR (anything raised)."""
    try:
        return measure(model, s, overrides, device)
    except Exception as err:
        kind = "FAILED" if isinstance(err, SeqmixError) and "training loss" in str(err) else "ERROR"
        return common.new_row(FIELDS, model=model, experiment=experiment_of(model, s.task),
                              status=f"{kind}: {' '.join(str(err).split())[:300]}")


TABLE = [("model", "model", ""), ("variant", "variant", ""), ("params", lambda r: r["parameters"] and f"{r['parameters'] / 1e6:.1f}M", ""),
         ("updates", "updates", ""), ("sent/upd", "sentences_per_update", ".0f"),
         ("tgt tok/upd", "tgt_tokens_per_update", ".0f"), ("1st upd s", "first_update_s", ".1f"),
         ("ms/update", "ms_per_update", ".0f"),
         ("min-max ms", lambda r: f"{r['ms_min']:.0f}-{r['ms_max']:.0f}" if common.ok(r) else None, ""),
         ("tgt tok/s", "tokens_per_s", ".0f"), ("speed x", "speed_ratio", ".2f"), ("time x", "time_ratio", ".2f"),
         ("x variant", "variant_speed_ratio", ".2f"),
         ("cpu ms", "cpu_ms_per_update", ".0f"), ("cpu x", "cpu_time_ratio", ".2f"),
         ("MFLOP/tok", lambda r: r["flops_per_tgt_token"] and r["flops_per_tgt_token"] / 1e6, ".1f"),
         ("GFLOP/s", "gflops_per_s", ".0f"), ("matmul x", "matmul_fraction", ".2f"), ("status", "status", "")]


def section(s: Settings, device: torch.device, out: Path, log=print) -> tuple[dict, list[str]]:
    log(f"\n== training: full updates of the {s.task} CPU recipes, median of {s.repeats} after {s.warmup} warm-up")
    rows, threads = run(s, device, log), torch.get_num_threads()
    data, same = sorted({r["data"] for r in rows if r["data"]}), len({r["batch_digest"] for r in rows if common.ok(r)}) < 2
    common.print_table(f"{'; '.join(data) or '-'}{'' if same else ' (WARNING: not the same batches)'}; x: over "
                       f"{BASELINE}'s, this run, {threads} threads", rows, TABLE)
    if any(map(common.ok, rows)):
        label = (lambda r: r["model"]) if len(s.variants) == 1 else (lambda r: f"{r['model']}\n{r['variant']}")
        bar_panels({f"{device}, {threads} threads": [(label(r), r["tokens_per_s"], "FAILED" if not common.ok(r) else
                    f"{r['tokens_per_s']:.0f}\n{r['ms_per_update']:.0f} ms\n{common.cell(r['speed_ratio'], '.2f')}x",
                    r["model"] == BASELINE) for r in rows]}, "target tokens / s (training updates)",
                   out / "training.png", "training updates, " + ", ".join(data))
    info = {"device": str(device), "torch_threads": threads, "same_batches": same, "data": data, "baseline": BASELINE}
    return {"info": info, "rows": common.write_csv(out / "training.csv", rows)}, \
        [f"training {r['model']}: {r['status']}" for r in rows if not common.ok(r)]
