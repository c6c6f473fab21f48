"""Training throughput of the Multi30k CPU recipes: full training updates (forward + loss + backward + optimizer
step) of every model, timed on the same batches in the same run, with target tokens/s against the Transformer's.

Each model is composed through Hydra from ``conf/experiment/multi30k_<name>_cpu.yaml`` exactly as ``train.py``
composes it (model, optimizer, label smoothing, dropout, batch token budget, gradient clipping, precision), built
by its task class (as ``train.py``: ``build_task``) and trained in train mode (dropout on) outside Lightning.
Batches are the recipe's own: the first token-budget batches of the Multi30k training loader (epoch 0, the
recipe's seed); every model sees the same batches when the recipes share the data settings. Without the data
(or with ``synthetic=True``) batches are synthetic: random tokens with Multi30k-like lengths, packed to the same
token budget. Which one was used is stated in every row (``data``).

Not timed: the learning-rate scheduler step (a few scalar ops) and Lightning's own per-step bookkeeping and
logging; what is timed is what every model pays per update.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.plotting import save_figure

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
BASELINE = "transformer_small"
# The Multi30k CPU recipes (conf/experiment/multi30k_<name>_cpu.yaml), baseline first.
RECIPES = ("transformer_small", "lightconv_small", "dynamicconv_small", "talk_small", "convs2s_small",
           "disco_small", "cmlm_small")
SYNTHETIC = "synthetic (Multi30k-like lengths)"
# Multi30k task 1 train (29,000 pairs) under the recipes' 8K joint BPE: tokens per sentence without eos, measured
# mean and sd of en (source) and de (target); synthetic lengths are drawn from log-normals with these moments.
# Only used when the real data cannot be read (or with synthetic=True).
SYNTHETIC_LENGTHS = {"src": (14.3, 4.8), "tgt": (14.8, 5.5)}


@dataclass
class TrainResult:
    model: str
    experiment: str
    parameters: int | None = None
    data: str = ""
    max_tokens: int = 0  # padded tokens per batch (the recipe's task.data.max_tokens unless overridden)
    accumulate: int = 1  # batches per update (trainer.accumulate_grad_batches)
    updates: int = 0  # timed updates
    sentences_per_update: float | None = None  # mean over the timed updates
    tgt_tokens_per_update: float | None = None  # real target tokens (eos included, padding not), mean
    ms_per_update: float | None = None  # median
    ms_min: float | None = None
    ms_max: float | None = None
    tokens_per_s: float | None = None  # median over the timed updates of target tokens / update time
    speed_ratio: float | None = None  # tokens_per_s over the baseline's, same run
    time_ratio: float | None = None  # ms_per_update over the baseline's (same batches: same work)
    # CPU only: process CPU time per update (all threads), median, and over the baseline's. On a CPU shared with
    # another job the wall clock includes waiting for a core; CPU time does not (steadiest with --threads 1).
    cpu_ms_per_update: float | None = None
    cpu_time_ratio: float | None = None
    final_loss: float | None = None  # per-token training loss of the last timed update (finite, or refused)
    batch_digest: str = ""  # of the batches' token ids: equal digests = the models trained on the same batches
    status: str = "ok"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def experiment_of(model: str) -> str:
    """``transformer_small`` -> ``multi30k_transformer_cpu``."""
    return f"multi30k_{model.removesuffix('_small')}_cpu"


def compose_recipe(model: str, overrides: list[str] | tuple[str, ...] = ()):
    """The run config ``python train.py experiment=multi30k_<name>_cpu`` would get (outside a Hydra run, so the
    output directory is pinned and no logger is configured)."""
    from hydra import compose, initialize_config_dir

    from seqmix.cli.resolvers import register_resolvers

    register_resolvers()
    exp = experiment_of(model)
    if not (CONF_DIR / "experiment" / f"{exp}.yaml").is_file():
        known = sorted(p.stem for p in (CONF_DIR / "experiment").glob("multi30k_*_cpu.yaml"))
        raise ValueError(f"no recipe conf/experiment/{exp}.yaml for model {model!r}; recipes: {known}")
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="train", overrides=[f"experiment={exp}", "logger=none",
                                                       "paths.output_dir=" + str(REPO_ROOT / "outputs" / "bench"),
                                                       *overrides])


# ----------------------------------------------------------------------------------------------- batches

class _StubTokenizer:
    """What a task needs of a tokenizer when no real one exists (synthetic batches)."""

    bos, pad, eos, unk = 0, 1, 2, 3

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size


def real_batches(cfg, n: int) -> tuple[list[dict], object]:
    """The first ``n`` batches of the recipe's training loader (shuffled with the recipe's seed, epoch 0)."""
    from hydra.utils import instantiate

    dm = instantiate(cfg.task.data, _convert_="all")
    dm.setup("fit")
    loader = dm.train_dataloader()
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == n:
            break
    if len(batches) < n:
        batches = [batches[i % len(batches)] for i in range(n)]
    return batches, dm.tokenizer


def synthetic_batches(n: int, max_tokens: int, vocab_size: int, max_positions: int = 256, seed: int = 1,
                      tokenizer=None) -> list[dict]:
    """``n`` token-budget batches of random tokens whose lengths follow :data:`SYNTHETIC_LENGTHS`."""
    from seqmix.data import PairDataset, TokenBudgetBatchSampler, collate_pairs

    tok = tokenizer or _StubTokenizer(vocab_size)
    rng = np.random.default_rng(seed)
    count = max(64, 4 * n * max_tokens // 16)  # enough sentences for n batches of ~16-token sentences

    def lengths(mean: float, sd: float) -> np.ndarray:
        sigma = math.sqrt(math.log(1 + (sd / mean) ** 2))
        mu = math.log(mean) - sigma**2 / 2
        longest = min(max_positions, max_tokens) - 1  # with eos, one sentence must fit the budget and the model
        return np.clip(np.rint(rng.lognormal(mu, sigma, count)), 1, longest).astype(int)

    src_len, tgt_len = lengths(*SYNTHETIC_LENGTHS["src"]), lengths(*SYNTHETIC_LENGTHS["tgt"])
    first = 4  # after bos, pad, eos, unk
    src = [rng.integers(first, vocab_size, size=k).tolist() for k in src_len]
    tgt = [rng.integers(first, vocab_size, size=k).tolist() for k in tgt_len]
    ds = PairDataset.from_lists(src, tgt, [""] * count, [""] * count, eos=tok.eos)
    sampler = TokenBudgetBatchSampler(ds.src_sizes, ds.tgt_sizes, max_tokens, shuffle=True, seed=seed)
    batches = [collate_pairs([ds[i] for i in idx], tok.pad, tok.bos, tok.eos) for idx in sampler]
    return [batches[i % len(batches)] for i in range(n)]


# ----------------------------------------------------------------------------------------------- timing

def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _autocast(cfg, device: torch.device):
    precision = str(cfg.trainer.get("precision", "32-true"))
    if precision.startswith("bf16"):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision.startswith("16"):
        return torch.autocast(device.type, dtype=torch.float16)
    return torch.autocast(device.type, enabled=False)


def _to(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def batch_digest(batches: list[dict]) -> str:
    h = hashlib.sha1()
    for b in batches:
        for key in ("src_tokens", "target"):
            t = b[key].cpu().contiguous()
            h.update(str(tuple(t.shape)).encode())
            h.update(t.numpy().tobytes())
    return h.hexdigest()[:12]


def make_update(task, optimizer, cfg, device: torch.device):
    """``update(batches) -> per-token loss``: one optimizer update over ``batches`` (accumulated), as Lightning
    runs it for the recipe: loss / scored tokens, backward, optional clipping, step, zero_grad."""
    clip = float(cfg.trainer.get("gradient_clip_val") or 0.0)
    params = [p for p in task.parameters() if p.requires_grad]

    def update(batches: list[dict]) -> float:
        total = 0.0
        for batch in batches:
            with _autocast(cfg, device):
                loss, _, ntokens = task.compute_loss(batch)
            scaled = loss / max(ntokens, 1)
            (scaled / len(batches)).backward()
            total += float(scaled.detach())
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return total / len(batches)

    return update


def measure_model(model: str, batches: list[dict], tokenizer, data: str, warmup: int, repeats: int,
                  device: torch.device, cfg=None, overrides: tuple[str, ...] = ()) -> TrainResult:
    """Build the recipe's model + optimizer, run ``warmup`` untimed then ``repeats`` timed updates."""
    from hydra.utils import instantiate

    from seqmix.cli.common import build_task
    from seqmix.models import count_parameters

    cfg = cfg if cfg is not None else compose_recipe(model, overrides)
    accum = int(cfg.trainer.get("accumulate_grad_batches") or 1)
    row = TrainResult(model=str(cfg.model.name), experiment=experiment_of(model), data=data,
                      max_tokens=int(cfg.task.data.max_tokens), accumulate=accum)
    torch.manual_seed(int(cfg.seed))
    task = build_task(cfg, tokenizer).to(device)
    task.train()
    row.parameters = count_parameters(task.model)
    optimizer = instantiate(cfg.optim)(params=task.parameters())
    update = make_update(task, optimizer, cfg, device)
    need = (warmup + repeats) * accum
    if len(batches) < need:
        raise ValueError(f"{need} batches needed, {len(batches)} given")
    row.batch_digest = batch_digest(batches[:need])
    groups = [[_to(b, device) for b in batches[i * accum:(i + 1) * accum]] for i in range(warmup + repeats)]
    times, cpu_times, tokens, sentences, loss = [], [], [], [], float("nan")
    for k, group in enumerate(groups):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        loss = update(group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed, cpu_elapsed = time.perf_counter() - start, time.process_time() - cpu_start
        if not math.isfinite(loss):
            row.status = f"FAILED: training loss {loss} at update {k + 1}"
            return row
        if k >= warmup:
            times.append(elapsed)
            cpu_times.append(cpu_elapsed)
            tokens.append(sum(int(b["ntokens"]) for b in group))
            sentences.append(sum(int(b["nsentences"]) for b in group))
    row.updates = len(times)
    row.final_loss = loss
    row.ms_per_update = 1000 * statistics.median(times)
    row.ms_min, row.ms_max = 1000 * min(times), 1000 * max(times)
    if device.type == "cpu":
        row.cpu_ms_per_update = 1000 * statistics.median(cpu_times)
    row.tokens_per_s = statistics.median(n / t for n, t in zip(tokens, times))
    row.tgt_tokens_per_update = statistics.fmean(tokens)
    row.sentences_per_update = statistics.fmean(sentences)
    return row


def add_ratios(rows: list[TrainResult], baseline: str = BASELINE) -> None:
    """speed x = tokens/s over the baseline row's, time x = ms/update over it, cpu x = CPU ms/update over it
    (None without a good baseline)."""
    base = next((r for r in rows if r.model == baseline and r.ok), None)
    for r in rows:
        ok = base is not None and r.ok
        r.speed_ratio = r.tokens_per_s / base.tokens_per_s if ok else None
        r.time_ratio = r.ms_per_update / base.ms_per_update if ok else None
        cpu = ok and r.cpu_ms_per_update is not None and bool(base.cpu_ms_per_update)
        r.cpu_time_ratio = r.cpu_ms_per_update / base.cpu_ms_per_update if cpu else None


def run_training_benchmark(models: list[str] | tuple[str, ...] = RECIPES, warmup: int = 1, repeats: int = 5,
                           max_tokens: int | None = None, device: str = "auto", synthetic: bool = False,
                           data_dir: str | Path | None = None, log=print) -> dict:
    """One row per recipe (baseline first, always measured); {"rows", "info"}. A model that raises or whose
    loss is not finite gets a FAILED/ERROR row without numbers; the others continue."""
    from omegaconf import OmegaConf

    models = [BASELINE, *[m for m in models if m != BASELINE]]
    dev = _device(device)
    overrides = []
    if max_tokens:
        overrides.append(f"task.data.max_tokens={int(max_tokens)}")
    if data_dir:
        overrides.append(f"paths.data_dir={Path(data_dir).resolve().parent}")
    data_cache: dict[str, tuple[list[dict], object, str]] = {}
    rows: list[TrainResult] = []
    for model in models:
        try:
            cfg = compose_recipe(model, overrides)
            n = (warmup + repeats) * int(cfg.trainer.get("accumulate_grad_batches") or 1)
            key = OmegaConf.to_yaml(cfg.task.data, resolve=True) + f"|{n}|{synthetic}"
            if key not in data_cache:
                data_cache[key] = _batches_for(cfg, n, synthetic, log)
            batches, tokenizer, data = data_cache[key]
            row = measure_model(model, batches, tokenizer, data, warmup, repeats, dev, cfg=cfg)
        except Exception as err:  # one broken recipe must not take the others down
            message = " ".join(str(err).split())  # Hydra puts the cause on later lines: keep them, on one line
            row = TrainResult(model=model, experiment=experiment_of(model),
                              status=f"ERROR: {type(err).__name__}: {message[:300]}")
        rows.append(row)
        if row.ok:
            log(f"  {row.model}: {row.ms_per_update:.0f} ms/update, {row.tokens_per_s:.0f} target tokens/s "
                f"({row.parameters:,} parameters)")
        else:
            log(f"  {model}: {row.status}")
    add_ratios(rows)
    digests = {r.batch_digest for r in rows if r.ok}
    if len(digests) > 1:
        log("training: warning: the recipes' data settings differ, so not every model trained on the same batches "
            "(see batch_digest); ratios compare different batches")
    info = {"same_batches": len(digests) <= 1, "device": str(dev), "torch_threads": torch.get_num_threads(), "warmup": warmup, "repeats": repeats,
            "baseline": BASELINE, "data": sorted({r.data for r in rows if r.data}),
            "timed": "forward + loss + backward + optimizer step (+ clipping if the recipe clips); median"}
    return {"rows": rows, "info": info}


def _batches_for(cfg, n: int, synthetic: bool, log) -> tuple[list[dict], object, str]:
    if not synthetic:
        try:
            batches, tokenizer = real_batches(cfg, n)
            return batches, tokenizer, f"multi30k train ({cfg.task.data.source.get('path', '?')})"
        except Exception as err:
            log(f"training: real Multi30k batches unavailable ({type(err).__name__}: {err}); "
                "using synthetic batches with Multi30k-like lengths")
    tok = _StubTokenizer(int(cfg.task.vocab_size))
    max_pos = min(int(cfg.model.max_source_positions), int(cfg.model.max_target_positions))
    return synthetic_batches(n, int(cfg.task.data.max_tokens), tok.vocab_size, max_pos, int(cfg.seed), tok), tok, \
        SYNTHETIC


# ----------------------------------------------------------------------------------------------- output

def format_table(rows: list[TrainResult]) -> str:
    header = ["model", "params", "updates", "sent/upd", "tgt tok/upd", "ms/update", "min-max ms", "tgt tok/s",
              "speed x", "time x", "cpu ms", "cpu x"]

    def f(v, spec):
        return "-" if v is None else format(v, spec)

    lines = [[r.model, f"{r.parameters / 1e6:.1f}M", str(r.updates), f(r.sentences_per_update, ".0f"),
              f(r.tgt_tokens_per_update, ".0f"), f(r.ms_per_update, ".0f"), f"{r.ms_min:.0f}-{r.ms_max:.0f}",
              f(r.tokens_per_s, ".0f"), f(r.speed_ratio, ".2f"), f(r.time_ratio, ".2f"),
              f(r.cpu_ms_per_update, ".0f"), f(r.cpu_time_ratio, ".2f")] for r in rows if r.ok]
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h) for i, h in enumerate(header)]
    widths[0] = max([widths[0], *(len(r.model) for r in rows)])

    def render(cells):
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths))

    out, good = [render(header), "  ".join("-" * w for w in widths)], iter(lines)
    for r in rows:  # a failed row gets its status instead of numbers
        out.append(render(next(good)) if r.ok else f"{r.model.rjust(widths[0])}  {r.status}")
    return "\n".join(out)


def as_dicts(rows: list[TrainResult]) -> list[dict]:
    return [asdict(r) for r in rows]


def plot(rows: list[TrainResult], path: Path, title: str) -> None:
    """Target tokens/s per model (bars), ms/update and the ratio to the baseline written on each bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in rows if r.ok]
    fig, ax = plt.subplots(figsize=(2.0 + 1.3 * len(rows), 4.4))
    xs = range(len(rows))
    bars = ax.bar(list(xs), [r.tokens_per_s or 0 for r in rows],
                  color=["tab:gray" if r.model == BASELINE else "tab:blue" for r in rows])
    for bar, r in zip(bars, rows):
        text = (f"{r.tokens_per_s:.0f}\n{r.ms_per_update:.0f} ms\n"
                + ("" if r.speed_ratio is None else f"{r.speed_ratio:.2f}x")) if r.ok else "FAILED"
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=7)
    ax.set_xticks(list(xs), [r.model for r in rows], fontsize=8, rotation=20)
    ax.set_ylabel("target tokens / s (training updates)")
    ax.set_ylim(0, max([r.tokens_per_s for r in ok] or [1]) * 1.35)
    ax.set_title(title, fontsize=9)
    save_figure(fig, path)
