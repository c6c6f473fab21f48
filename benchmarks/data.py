"""Data pipeline at WMT scale on synthetic corpora (README.md, section 5), every figure from a fresh process:
``preprocess.py`` into token stores, then start-up, memory and loader throughput of what ``train.py`` runs for data."""

from __future__ import annotations

import gzip
import hashlib
import os
import random
import runpy
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.plotting import line_panels

MIN_WORDS, VOCAB_SIZE = 26, 32768  # WMT'16 En-De's mean English words per pair and joint BPE size
FIELDS = ("corpus size path preprocess_s preprocess_peak_gb startup_s startup_peak_gb data_anon_mb data_file_mb "
          "batches_per_s_w0 batches_per_s_w2 loader_x examples first_batch status")


@dataclass
class Settings:
    sizes: tuple[int, ...] = (500_000, 1_000_000, 4_500_000)  # translation pairs
    lm_tokens: int = 100_000_000  # LM stream (0: none)
    batches: int = 300  # loader batches timed, with 0 and 2 workers
    shared_dir: str | None = None  # holds multi30k/ and wikitext-2/ (default: paths.data_dir, as train.py)
    work: str | None = None  # corpora and stores (default: a temporary folder)
    keep: bool = False


QUICK = {"sizes": (20_000,), "lm_tokens": 1_000_000, "batches": 50}


def write_parallel_corpus(multi30k: Path, out: Path, pairs: int, seed: int = 1) -> Path:
    """``out/train.{en,de}``: ``pairs`` WMT-length pairs joined from Multi30k train; ``out/val.*``: Multi30k val."""
    en, de = (gzip.decompress((multi30k / f"train.{x}.gz").read_bytes()).decode().split("\n")[:-1] for x in ("en", "de"))
    words, rng = [len(s.split()) for s in en], random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.en", "w", encoding="utf-8") as fe, open(out / "train.de", "w", encoding="utf-8") as fd:
        for start in range(0, pairs, 50_000):  # in blocks: memory stays flat at any size
            joined = []
            for _ in range(min(50_000, pairs - start)):
                joined.append([rng.randrange(len(en))])
                while sum(words[i] for i in joined[-1]) < MIN_WORDS:
                    joined[-1].append(rng.randrange(len(en)))
            fe.write("".join(" ".join(en[i] for i in p) + "\n" for p in joined))
            fd.write("".join(" ".join(de[i] for i in p) + "\n" for p in joined))
    for lang in ("en", "de"):
        (out / f"val.{lang}").write_bytes(gzip.decompress((multi30k / f"val.{lang}.gz").read_bytes()))
    return out


def write_text_corpus(wikitext2: Path, out: Path, tokens: int, seed: int = 1) -> Path:
    """``out/train.txt``: WikiText-2 train lines drawn at random until ``tokens`` word tokens (eos per line)."""
    lines = (wikitext2 / "train.txt").read_text(encoding="utf-8").split("\n")[:-1]
    counts, rng, total = [len(line.split()) + 1 for line in lines], random.Random(seed), 0
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.txt", "w", encoding="utf-8") as f:
        while total < tokens:
            block = rng.choices(range(len(lines)), k=20_000)
            f.write("".join(lines[i] + "\n" for i in block))
            total += sum(counts[i] for i in block)
    return out


def child(spec: dict) -> None:
    """A fresh process: preprocess.py, or train.py's data path to the first batch, then the loader (0, 2 workers)."""
    if spec.get("preprocess"):
        sys.argv = ["preprocess.py", *spec["overrides"]]
        try:
            runpy.run_path("preprocess.py", run_name="__main__")
        finally:
            common.report({"preprocess_peak_gb": common.proc_status_kb()["VmHWM"] / 2**20})
        return
    import lightning  # noqa: F401  (training imports it anyway: not counted as data)
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from seqmix.config.resolvers import register_resolvers

    register_resolvers()
    torch.set_num_threads(1)
    before = common.proc_status_kb()
    with initialize_config_dir(str(common.REPO_ROOT / "conf"), version_base="1.3"):
        dm = instantiate(compose("train", overrides=spec["overrides"]).task.data, _convert_="all")
    dm.setup("fit")
    it = iter(dm.train_dataloader())
    first, now, after = next(it), time.time(), common.proc_status_kb()
    ids = b"".join(t.long().numpy().tobytes() for t in first.values() if torch.is_tensor(t) and not t.is_floating_point())
    res = {"first_batch_time": now, "examples": len(dm.datasets["train"]), "first_batch": hashlib.sha256(ids).hexdigest()[:16],
           "data_anon_mb": (after["RssAnon"] - before["RssAnon"]) / 1024,
           "data_file_mb": (after["RssFile"] - before["RssFile"]) / 1024}
    for workers in (0, 2):
        dm.num_workers = workers
        it = it if workers == 0 else iter(dm.train_dataloader())
        next(it)  # workers started and warm
        start = time.perf_counter()
        done = sum(1 for _ in zip(range(spec["batches"]), it))
        res[f"batches_per_s_w{workers}"] = done / (time.perf_counter() - start)
    common.report(res | {"startup_peak_gb": common.proc_status_kb()["VmHWM"] / 2**20})


def measure(corpus: str, size: int, overrides: list[str], s: Settings, env: dict, log) -> dict:
    """Preprocessing, then start-up and the loader, each in a fresh process; a failure: a row without numbers."""
    row = common.new_row(FIELDS, corpus=corpus, size=size, path="store", status="ok")
    try:
        for spec in ({"overrides": overrides, "preprocess": True}, {"overrides": overrides, "batches": s.batches}):
            log(f"  {corpus} {size:,}: {'preprocess.py' if spec.get('preprocess') else 'start-up and loader'}")
            t0 = time.time()
            r = common.child_result(common.spawn("benchmarks.data:child", spec, env))
            row |= {k: v for k, v in r.items() if k in row} | (
                {"preprocess_s": time.time() - t0} if spec.get("preprocess") else {"startup_s": r["first_batch_time"] - t0})
    except RuntimeError as err:
        row["status"] = f"ERROR: {err}"
    return row


def run(s: Settings, log=print) -> dict:
    """{"rows", "info"}: a row per (corpus, size)."""
    from benchmarks import training

    shared = Path(s.shared_dir or common.DATA_DIR)
    work = Path(s.work or tempfile.mkdtemp(prefix="seqmix-data-bench-"))
    env = {**os.environ, "PYTHONHASHSEED": "0", "HYDRA_FULL_ERROR": "1"}
    [step] = training.run(training.Settings(models=(), warmup=1, repeats=5, data_dir=str(shared)), torch.device("cpu"), log)
    if not common.ok(step):
        raise RuntimeError(f"the recipe's training step failed: {step['status']}")
    rows = []
    info = {"work": str(work), "recipe_steps_per_s": 1000 / step["ms_per_update"], "recipe": step["experiment"]}
    jobs = [("translation", n, write_parallel_corpus, "multi30k") for n in sorted(s.sizes)]
    try:
        for kind, size, write, source in jobs + [("lm", s.lm_tokens, write_text_corpus, "wikitext-2")] * bool(s.lm_tokens):
            log(f"{kind}, {size:,}: generating the corpus")
            corpus, cache = write(shared / source, work / f"{kind}-{size}", size), work / f"cache-{kind}-{size}"
            overrides = ["task=multi30k_ende", f"task.vocab_size={VOCAB_SIZE}"] if kind == "translation" else \
                ["task=wikitext2", "task.data.splits.valid=null", "task.data.splits.test=null"]
            overrides += [f"task.data.source.path={corpus}", f"paths.cache_dir={cache}"]
            rows.append(measure(kind, size, overrides, s, env, log))
            for path in (corpus, cache) if not s.keep else ():
                shutil.rmtree(path, ignore_errors=True)
    finally:
        if not (s.work or s.keep):
            shutil.rmtree(work, ignore_errors=True)
    for r in rows:
        r["loader_x"] = r["batches_per_s_w0"] and r["batches_per_s_w0"] / info["recipe_steps_per_s"]
    return {"rows": rows, "info": info}


TABLE = [("corpus", "corpus", ""), ("size", "size", ","), ("path", "path", ""), ("prep s", "preprocess_s", ".1f"),
         ("prep GB", "preprocess_peak_gb", ".2f"), ("start s", "startup_s", ".1f"), ("peak GB", "startup_peak_gb", ".2f"),
         ("anon MB", "data_anon_mb", ".0f"), ("file MB", "data_file_mb", ".0f"), ("b/s w0", "batches_per_s_w0", ".0f"),
         ("b/s w2", "batches_per_s_w2", ".0f"), ("x step", "loader_x", ".0f"), ("examples", "examples", ","),
         ("batch", "first_batch", ""), ("status", "status", "")]


def section(s: Settings, device, out: Path, log=print) -> tuple[dict, list[str]]:
    log("\n== data: token stores on synthetic WMT-like corpora and an LM stream (a fresh process per figure)")
    res = run(s, log)
    common.print_table(f"x step = b/s w0 over {res['info']['recipe']}'s {res['info']['recipe_steps_per_s']:.2f} "
                       "training updates/s, this run", res["rows"], TABLE)
    good = [r for r in res["rows"] if common.ok(r) and r["corpus"] == "translation"]
    if good:
        line_panels([(label, {"store": [(r["size"], r[key]) for r in good if r[key]]}) for key, label in (
            ("preprocess_s", "preprocess.py (s)"), ("startup_s", "start-up to first batch (s)"),
            ("startup_peak_gb", "training process peak RSS (GB)"))], "training pairs", out / "data.png",
            "synthetic WMT-like corpora, token stores")
    failed = [f"data {r['corpus']} {r['size']:,}: {r['status']}" for r in res["rows"] if not common.ok(r)]
    return {**res, "rows": common.write_csv(out / "data.csv", res["rows"])}, failed
