"""Data pipeline at real scale: token stores against the previous in-memory path, on synthetic corpora.

Corpora (generated here, seeded, streamed to disk; never committed):
- **WMT-like parallel text**: each synthetic pair joins randomly drawn Multi30k train pairs (English and German
  sides alike) until the English side has at least 26 words, WMT'16 En-De's mean length; sizes of 0.5M, 1M and
  4.5M pairs (WMT'16 En-De's size). The words are Multi30k's, so the vocabulary is far smaller than real WMT's:
  BPE training here is cheaper than on the real corpus (its merges are learned from distinct words).
- **LM stream**: WikiText-2 train lines resampled at random until the stream holds 100M word tokens (eos
  included), the size of WikiText-103.

Every figure comes from a fresh process: preprocessing is ``python preprocess.py`` itself (wall time, peak RSS from
``wait4``); start-up runs what ``train.py`` runs for data (Hydra composition, the data module's ``setup``, the
training loader) up to the first batch, reading RSS from ``/proc/self/status`` after the imports and after that
batch; loader throughput is batches/s after the first batch with 0 and 2 workers. The previous path is the code of
``LEGACY_COMMIT`` (the last commit before token stores), extracted with ``git archive`` and run the same way: its
first run trains the tokenizer and encodes (its "preprocessing"), its second run starts from its cache. Sharing
between DDP ranks: two processes open the same store, fault in every page of the train split and report the
resident (Rss) and proportional (Pss) size of their store mappings from ``/proc/self/smaps``.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.plotting import save_figure, style_log_axes

REPO_ROOT = Path(__file__).resolve().parents[1]
LEGACY_COMMIT = "dc4faa371d0a9f759f5edc7c4d6d72e7ea7e13cd"  # in-memory lists, per-process encoding cache
DEFAULT_SIZES = (500_000, 1_000_000, 4_500_000)
DEFAULT_LEGACY_SIZES = (500_000, 1_000_000)
DEFAULT_LM_TOKENS = 100_000_000
MIN_WORDS = 26  # English words per synthetic pair, at least
VOCAB_SIZE = 32768  # WMT'16 En-De's joint BPE (conf/task/wmt_ende.yaml)
LOADER_BATCHES = 300
# Targets of issue 15 on this machine, checked against the largest translation size.
TARGETS = {"preprocess_s": 8 * 60, "preprocess_gb": 4.0, "startup_s": 15.0, "data_rss_gb": 1.0, "loader_x": 20.0}


@dataclass
class DataRow:
    corpus: str  # "translation" or "lm"
    size: int  # pairs or tokens
    path: str  # "store" or "legacy"
    preprocess_s: float | None = None
    preprocess_peak_gb: float | None = None
    startup_s: float | None = None  # process start to first training batch, store (or cache) present
    startup_peak_gb: float | None = None
    data_anon_mb: float | None = None  # private RSS grown between the imports and the first batch
    data_file_mb: float | None = None  # file-backed RSS grown likewise (shared page cache: the store's pages)
    batches_per_s_w0: float | None = None
    batches_per_s_w2: float | None = None
    loader_x: float | None = None  # batches/s (0 workers) over the Multi30k recipe's training updates/s
    examples: int | None = None  # training examples after length filtering
    first_batch: str = ""  # digest of the first training batch's tokens: equal = the same batches
    status: str = "ok"


@dataclass
class Sharing:
    size: int
    store_mb: float  # bytes of the train store's files
    rss_mb: list[float] = field(default_factory=list)  # per process, store mappings
    pss_mb: list[float] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------- corpora

def _gz_lines(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8", newline="\n") as f:
        return f.read().split("\n")[:-1]


def write_parallel_corpus(multi30k: Path, out: Path, pairs: int, seed: int = 1) -> Path:
    """``out/train.{en,de}`` with ``pairs`` WMT-length pairs built from Multi30k train, ``out/val.{en,de}`` a copy
    of Multi30k val. Written in blocks, so memory stays flat at any size."""
    en, de = _gz_lines(multi30k / "train.en.gz"), _gz_lines(multi30k / "train.de.gz")
    words = [len(s.split()) for s in en]
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.en", "w", encoding="utf-8") as fe, open(out / "train.de", "w", encoding="utf-8") as fd:
        for start in range(0, pairs, 50_000):
            block_en, block_de = [], []
            for _ in range(min(50_000, pairs - start)):
                parts, n = [], 0
                while n < MIN_WORDS:
                    i = rng.randrange(len(en))
                    parts.append(i)
                    n += words[i]
                block_en.append(" ".join(en[i] for i in parts))
                block_de.append(" ".join(de[i] for i in parts))
            fe.write("\n".join(block_en) + "\n")
            fd.write("\n".join(block_de) + "\n")
    for lang in ("en", "de"):
        (out / f"val.{lang}").write_text("\n".join(_gz_lines(multi30k / f"val.{lang}.gz")) + "\n", encoding="utf-8")
    return out


def write_text_corpus(wikitext2: Path, out: Path, tokens: int, seed: int = 1) -> Path:
    """``out/train.txt``: WikiText-2 train lines drawn at random until ``tokens`` word tokens (one eos per line)."""
    lines = (wikitext2 / "train.txt").read_text(encoding="utf-8").split("\n")[:-1]
    counts = [len(line.split()) + 1 for line in lines]
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    with open(out / "train.txt", "w", encoding="utf-8") as f:
        while total < tokens:
            block = rng.choices(range(len(lines)), k=20_000)
            f.write("".join(lines[i] + "\n" for i in block))
            total += sum(counts[i] for i in block)
    return out


# ----------------------------------------------------------------------------------------------- child processes

def _status_mb() -> dict:
    """This process's resident set now and its high-water mark (VmHWM belongs to the process image, so unlike
    ``ru_maxrss`` it does not inherit the spawning parent's peak across fork and exec)."""
    values = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values


def _store_mappings_mb(marker: str) -> tuple[float, float]:
    """(Rss, Pss) in MB of this process's mappings of files whose path contains ``marker``."""
    rss = pss = 0
    current = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            current = len(head) >= 6 and marker in head[-1]
        elif current and head[0] == "Rss:":
            rss += int(head[1])
        elif current and head[0] == "Pss:":
            pss += int(head[1])
    return rss / 1024, pss / 1024


def _digest(batch) -> str:
    import torch

    h = hashlib.sha256()
    tensors = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else [batch]
    for t in tensors:
        if isinstance(t, torch.Tensor) and not t.is_floating_point():
            h.update(t.to(torch.int64).numpy().tobytes())
    return h.hexdigest()[:16]


def child_main(spec: dict) -> None:
    """One measurement in this (fresh) process; prints one JSON line. ``spec``: root, overrides, mode, batches."""
    t_start = time.time()
    import lightning  # noqa: F401  (what training imports anyway, so not counted as data)
    import torch  # noqa: F401
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    import seqmix
    import seqmix.data  # noqa: F401

    if not Path(seqmix.__file__).resolve().is_relative_to(Path(spec["root"]).resolve()):
        raise RuntimeError(f"imported {seqmix.__file__}, expected the tree under {spec['root']}")
    try:
        from seqmix.cli.resolvers import register_resolvers

        register_resolvers()
    except ImportError:
        pass
    torch.set_num_threads(1)
    after_imports = _status_mb()
    with initialize_config_dir(str(Path(spec["root"]) / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=spec["overrides"])
    dm = instantiate(cfg.task.data, _convert_="all")
    dm.setup("fit")
    loader = dm.train_dataloader()
    it = iter(loader)
    first = next(it)
    result = {"first_batch_time": time.time(), "start": t_start, "after_imports": after_imports,
              "after_batch": _status_mb(), "examples": len(dm.datasets["train"]), "first_batch": _digest(first)}
    if spec["mode"] == "share":
        _share(spec, dm, result)
    elif spec.get("batches"):
        result["batches_per_s_w0"] = _rate(it, spec["batches"])
        del it, loader
        dm.num_workers = 2
        it = iter(dm.train_dataloader())
        next(it)  # workers started and warm
        result["batches_per_s_w2"] = _rate(it, spec["batches"])
    result["peak_mb"] = _status_mb()["VmHWM"]
    print("RESULT " + json.dumps(result), flush=True)


def _rate(it, n: int) -> float:
    start, done = time.perf_counter(), 0
    for _ in range(n):
        try:
            next(it)
        except StopIteration:
            break
        done += 1
    return done / (time.perf_counter() - start)


def _share(spec: dict, dm, result: dict) -> None:
    """Fault in every page of the train store, meet the other process, then read the store mappings' Rss/Pss."""
    import numpy as np

    store = dm.stores["train"]
    maps = [np.memmap(f, dtype=np.uint8, mode="r") for f in sorted(store.path.glob("*.bin")) if f.stat().st_size]
    result["touched"] = int(sum(int(m[::4096].sum()) for m in maps))  # one byte per page
    result["store_mb"] = sum(m.size for m in maps) / 2**20
    barrier = Path(spec["barrier"])
    (barrier / f"ready{spec['rank']}").touch()
    while len(list(barrier.glob("ready*"))) < 2:
        time.sleep(0.05)
    result["rss_mb"], result["pss_mb"] = _store_mappings_mb(".store/")
    (barrier / f"read{spec['rank']}").touch()
    while len(list(barrier.glob("read*"))) < 2:  # stay mapped until the other one has read its figures
        time.sleep(0.05)


BOOT = "import json, sys; sys.path[:0] = json.loads(sys.argv[1]); from benchmarks.data import child_main; " \
       "child_main(json.loads(sys.argv[2]))"


def _spawn(root: Path, spec: dict, env: dict, logs: Path) -> subprocess.Popen:
    """A fresh interpreter running ``child_main`` on the tree at ``root``; output goes to files (never a pipe that
    could fill up while the parent waits)."""
    paths = [str(root)] if root == REPO_ROOT else [str(root), str(REPO_ROOT)]
    name = logs / f"{spec['mode']}-{os.getpid()}-{time.monotonic_ns()}"
    with open(f"{name}.out", "w") as out, open(f"{name}.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", BOOT, json.dumps(paths),
                                 json.dumps({**spec, "root": str(root)})], cwd=REPO_ROOT, env=env, stdout=out,
                                stderr=err)
    proc.logs = name
    return proc


def _result(proc: subprocess.Popen, returncode: int) -> dict:
    """The child's RESULT line; its last stderr line in the error when it failed."""
    out, err = (Path(f"{proc.logs}.{kind}").read_text() for kind in ("out", "err"))
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    if returncode or not lines:
        tail = err.strip().splitlines()[-1] if err.strip() else "no result"
        raise RuntimeError(f"exit {returncode}: {tail}")
    return json.loads(lines[-1][len("RESULT "):])


# Runs a script as ``python script args`` would, printing its peak resident set (VmHWM) when it exits.
PEAK = ("import atexit, runpy, sys; atexit.register(lambda: print('VmHWM_kB', next(line.split()[1] for line in "
        "open('/proc/self/status') if line.startswith('VmHWM')), flush=True)); sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')")


def _run_timed(script: str, args: list[str], env: dict) -> tuple[float, float, str]:
    """(wall seconds, peak RSS GB, output) of ``python script args``."""
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", PEAK, script, *args], cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peaks = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("VmHWM_kB")]
    if proc.returncode or not peaks:
        raise RuntimeError(f"{script} exit {proc.returncode}: {proc.stdout.strip().splitlines()[-1:]}")
    return time.time() - t0, int(peaks[-1]) / 2**20, proc.stdout


def _measure(root: Path, spec: dict, env: dict, logs: Path) -> dict:
    t0 = time.time()
    proc = _spawn(root, spec, env, logs)
    result = _result(proc, proc.wait())
    result["wall_s"], result["peak_gb"] = time.time() - t0, result["peak_mb"] / 1024
    result["startup_s"] = result["first_batch_time"] - t0
    return result


# ----------------------------------------------------------------------------------------------- the benchmark

def translation_overrides(corpus: Path, cache: Path) -> list[str]:
    return ["task=multi30k_ende", f"task.vocab_size={VOCAB_SIZE}", f"task.data.source.path={corpus}",
            f"paths.cache_dir={cache}"]


def lm_overrides(corpus: Path, cache: Path) -> list[str]:
    return ["task=wikitext2", f"task.data.source.path={corpus}", "task.data.splits.valid=null",
            "task.data.splits.test=null", f"paths.cache_dir={cache}"]


def legacy_tree(work: Path) -> Path | None:
    """The previous pipeline's code (``seqmix`` and ``conf`` at ``LEGACY_COMMIT``), or None without git history."""
    target = work / "legacy"
    if (target / "seqmix").is_dir():
        return target
    target.mkdir(parents=True, exist_ok=True)
    try:
        archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", LEGACY_COMMIT, "seqmix", "conf"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        shutil.rmtree(target, ignore_errors=True)
        return None
    return target


def _env(threads: int | None) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": "0", "HYDRA_FULL_ERROR": "1"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def measure_store(corpus_kind: str, size: int, corpus: Path, cache: Path, env: dict, batches: int, logs: Path,
                  log=print) -> DataRow:
    overrides = (translation_overrides if corpus_kind == "translation" else lm_overrides)(corpus, cache)
    row = DataRow(corpus_kind, size, "store")
    try:
        log(f"  store: preprocess.py {corpus_kind} {size:,}")
        row.preprocess_s, row.preprocess_peak_gb, _ = _run_timed("preprocess.py", overrides, env)
        log(f"  store: start-up and loader {corpus_kind} {size:,}")
        r = _measure(REPO_ROOT, {"overrides": overrides, "mode": "startup", "batches": batches}, env, logs)
        _fill(row, r)
    except RuntimeError as e:
        row.status = f"ERROR: {e}"
    return row


def measure_legacy(size: int, corpus: Path, cache: Path, legacy: Path, env: dict, batches: int, logs: Path,
                   log=print) -> DataRow:
    overrides = translation_overrides(corpus, cache)
    row = DataRow("translation", size, "legacy")
    try:
        log(f"  legacy: first run (tokenizer + encoding) {size:,}")
        cold = _measure(legacy, {"overrides": overrides, "mode": "startup", "batches": 0}, env, logs)
        row.preprocess_s, row.preprocess_peak_gb = cold["wall_s"], cold["peak_gb"]
        log(f"  legacy: second run (encoding cache present) {size:,}")
        _fill(row, _measure(legacy, {"overrides": overrides, "mode": "startup", "batches": batches}, env, logs))
    except RuntimeError as e:
        row.status = f"ERROR: {e}"
    return row


def _fill(row: DataRow, r: dict) -> None:
    row.startup_s, row.startup_peak_gb = r["startup_s"], r["peak_gb"]
    row.data_anon_mb = r["after_batch"]["RssAnon"] - r["after_imports"]["RssAnon"]
    row.data_file_mb = r["after_batch"]["RssFile"] - r["after_imports"]["RssFile"]
    row.batches_per_s_w0, row.batches_per_s_w2 = r.get("batches_per_s_w0"), r.get("batches_per_s_w2")
    row.examples, row.first_batch = r["examples"], r["first_batch"]


def measure_sharing(size: int, corpus: Path, cache: Path, env: dict, logs: Path) -> Sharing:
    """Two processes on one store, as two DDP ranks on one machine."""
    with tempfile.TemporaryDirectory() as barrier:
        specs = [{"overrides": translation_overrides(corpus, cache), "mode": "share", "barrier": barrier, "rank": r}
                 for r in (0, 1)]
        procs = [_spawn(REPO_ROOT, spec, env, logs) for spec in specs]
        results = [_result(proc, proc.wait()) for proc in procs]
    return Sharing(size, results[0]["store_mb"], [r["rss_mb"] for r in results], [r["pss_mb"] for r in results])


def recipe_step_rate(data_dir: Path | None, synthetic: bool, log=print) -> tuple[float, str]:
    """Training updates/s of the Multi30k Transformer recipe (the benchmark's ``training`` section, in this run)."""
    from benchmarks import training

    res = training.run_training_benchmark([training.BASELINE], warmup=1, repeats=5, device="cpu",
                                          synthetic=synthetic, data_dir=data_dir, log=log)
    row = res["rows"][0]
    if not row.ok:
        raise RuntimeError(f"the recipe's training step failed: {row.status}")
    return 1000.0 / row.ms_per_update, f"{row.experiment}, {row.data}, {res['info']['torch_threads']} threads"


def run_data_benchmark(sizes=DEFAULT_SIZES, legacy_sizes=DEFAULT_LEGACY_SIZES, lm_tokens=DEFAULT_LM_TOKENS,
                       work: Path | None = None, data_dir: Path | None = None, batches: int = LOADER_BATCHES,
                       threads: int | None = None, keep: bool = False, synthetic_steps: bool = False,
                       log=print) -> dict:
    """{"rows", "sharing", "info"}: one row per (corpus, size, path)."""
    shared = Path(data_dir or os.environ.get("SEQMIX_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))
    owned = work is None
    work = Path(tempfile.mkdtemp(prefix="seqmix-data-bench-")) if owned else Path(work)
    work.mkdir(parents=True, exist_ok=True)
    env = _env(threads)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    rows: list[DataRow] = []
    sharing: list[Sharing] = []
    info: dict = {"work": str(work), "legacy_commit": LEGACY_COMMIT, "min_words": MIN_WORDS, "vocab": VOCAB_SIZE}
    try:
        steps_per_s, how = recipe_step_rate(shared / "multi30k", synthetic_steps, log)
        info["recipe_steps_per_s"], info["recipe"] = steps_per_s, how
        legacy = legacy_tree(work) if legacy_sizes else None
        if legacy_sizes and legacy is None:
            info["legacy"] = f"skipped: commit {LEGACY_COMMIT} is not in this checkout's history"
        for size in sorted(set(sizes) | set(legacy_sizes)):
            log(f"translation, {size:,} pairs: generating the corpus")
            t0 = time.perf_counter()
            corpus = write_parallel_corpus(shared / "multi30k", work / f"wmt-like-{size}", size)
            info[f"generate_{size}_s"] = time.perf_counter() - t0
            if size in sizes:
                rows.append(measure_store("translation", size, corpus, work / f"cache-store-{size}", env, batches,
                                          logs, log))
            if size in legacy_sizes and legacy is not None:
                rows.append(measure_legacy(size, corpus, work / f"cache-legacy-{size}", legacy, env, batches, logs,
                                           log))
                shutil.rmtree(work / f"cache-legacy-{size}", ignore_errors=True)
            stored = [r for r in rows if r.path == "store" and r.size == size and r.status == "ok"]
            if sizes and size == max(sizes) and stored:
                log(f"  store: two processes sharing one store, {size:,}")
                try:
                    sharing.append(measure_sharing(size, corpus, work / f"cache-store-{size}", env, logs))
                except RuntimeError as e:
                    info["sharing_error"] = str(e)
            if not keep:
                shutil.rmtree(corpus, ignore_errors=True)
                shutil.rmtree(work / f"cache-store-{size}", ignore_errors=True)
        if lm_tokens:
            log(f"language modeling, {lm_tokens:,} tokens: generating the stream")
            corpus = write_text_corpus(shared / "wikitext-2", work / f"lm-{lm_tokens}", lm_tokens)
            rows.append(measure_store("lm", lm_tokens, corpus, work / f"cache-lm-{lm_tokens}", env, batches, logs, log))
            if not keep:
                shutil.rmtree(corpus, ignore_errors=True)
                shutil.rmtree(work / f"cache-lm-{lm_tokens}", ignore_errors=True)
    finally:
        if owned and not keep:
            shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        if row.batches_per_s_w0:
            row.loader_x = row.batches_per_s_w0 / info["recipe_steps_per_s"]
    return {"rows": rows, "sharing": sharing, "info": info, "ratios": ratios(rows), "targets": targets(rows)}


def ratios(rows: list[DataRow]) -> list[dict]:
    """Legacy over store at each size both were measured at (above 1: the store is better)."""
    out = []
    for legacy in (r for r in rows if r.path == "legacy" and r.status == "ok"):
        store = next((r for r in rows if r.path == "store" and r.corpus == legacy.corpus and r.size == legacy.size
                      and r.status == "ok"), None)
        if store is None:
            continue
        entry = {"size": legacy.size, "same_batches": legacy.first_batch == store.first_batch}
        for key in ("preprocess_s", "preprocess_peak_gb", "startup_s", "startup_peak_gb", "data_anon_mb"):
            a, b = getattr(legacy, key), getattr(store, key)
            entry[key] = a / b if a is not None and b else None
        out.append(entry)
    return out


def targets(rows: list[DataRow]) -> list[dict]:
    """Issue 15's targets at the largest translation size measured on the store."""
    stores = [r for r in rows if r.path == "store" and r.corpus == "translation" and r.status == "ok"]
    if not stores:
        return []
    r = max(stores, key=lambda r: r.size)
    data_gb = ((r.data_anon_mb or 0) + max(r.data_file_mb or 0, 0)) / 1024
    checks = [("preprocessing time (s)", r.preprocess_s, TARGETS["preprocess_s"]),
              ("preprocessing peak RSS (GB)", r.preprocess_peak_gb, TARGETS["preprocess_gb"]),
              ("start-up to first batch (s)", r.startup_s, TARGETS["startup_s"]),
              ("RSS grown by data, anon + file (GB)", data_gb, TARGETS["data_rss_gb"])]
    out = [{"what": what, "size": r.size, "value": v, "target": f"<= {t}", "met": v is not None and v <= t}
           for what, v, t in checks]
    out.append({"what": "loader batches/s over recipe steps/s", "size": r.size, "value": r.loader_x,
                "target": f">= {TARGETS['loader_x']}", "met": r.loader_x is not None and r.loader_x >= TARGETS["loader_x"]})
    return out


# ----------------------------------------------------------------------------------------------- output

def _f(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(rows: list[DataRow]) -> str:
    head = (f"{'corpus':<11} {'size':>11} {'path':<6} {'prep s':>7} {'prep GB':>7} {'start s':>7} {'peak GB':>7} "
            f"{'anon MB':>8} {'file MB':>8} {'b/s w0':>7} {'b/s w2':>7} {'x step':>7} {'examples':>10} batch")
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.status != "ok":
            lines.append(f"{r.corpus:<11} {r.size:>11,} {r.path:<6} {r.status}")
            continue
        lines.append(f"{r.corpus:<11} {r.size:>11,} {r.path:<6} {_f(r.preprocess_s, '7.1f')} "
                     f"{_f(r.preprocess_peak_gb, '7.2f')} {_f(r.startup_s, '7.1f')} {_f(r.startup_peak_gb, '7.2f')} "
                     f"{_f(r.data_anon_mb, '8.0f')} {_f(r.data_file_mb, '8.0f')} {_f(r.batches_per_s_w0, '7.0f')} "
                     f"{_f(r.batches_per_s_w2, '7.0f')} {_f(r.loader_x, '7.0f')} {_f(r.examples, '10,')} "
                     f"{r.first_batch}")
    return "\n".join(lines)


def format_ratios(entries: list[dict]) -> str:
    lines = []
    for e in entries:
        parts = [f"{k.replace('_', ' ')} {v:.1f}x" for k, v in e.items() if k not in ("size", "same_batches") and v]
        lines.append(f"{e['size']:>11,} pairs, legacy / store: {', '.join(parts)}; same first batch: "
                     f"{'yes' if e['same_batches'] else 'NO'}")
    return "\n".join(lines)


def format_sharing(entries: list[Sharing]) -> str:
    return "\n".join(
        f"{s.size:>11,} pairs, train store {s.store_mb:.0f} MB, two processes: store Rss "
        f"{' + '.join(f'{v:.0f}' for v in s.rss_mb)} MB, Pss {' + '.join(f'{v:.0f}' for v in s.pss_mb)} MB "
        f"= {sum(s.pss_mb):.0f} MB resident once" for s in entries)


def format_targets(entries: list[dict]) -> str:
    return "\n".join(f"{'met   ' if t['met'] else 'MISSED'} {t['what']} at {t['size']:,}: "
                     f"{_f(t['value'], '.2f')} (target {t['target']})" for t in entries)


def as_dicts(rows: list[DataRow]) -> list[dict]:
    return [asdict(r) for r in rows]


def plot(rows: list[DataRow], path: Path, title: str) -> None:
    """Preprocessing time, start-up time and peak RSS per translation size: store against legacy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("preprocess_s", "preprocessing / first run (s)"), ("startup_s", "start-up to first batch (s)"),
              ("startup_peak_gb", "training process peak RSS (GB)")]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4))
    for ax, (key, label) in zip(axes, panels):
        for path_name, style in (("store", "o-"), ("legacy", "s--")):
            pts = [(r.size, getattr(r, key)) for r in rows if r.corpus == "translation" and r.path == path_name
                   and r.status == "ok" and getattr(r, key) is not None]
            if pts:
                ax.plot(*zip(*sorted(pts)), style, label=path_name)
        style_log_axes(ax, "training pairs", label)
    save_figure(fig, path, title)
