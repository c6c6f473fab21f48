"""Bad input, everywhere: each mistake a user can make with train.py, generate.py, preprocess.py or a side command
(python -m seqmix.report, python -m seqmix.interop.fairseq) ends with one
`seqmix: error:` line that says what to do, exit status 2, no traceback, and nothing left behind that looks like a
valid run, checkpoint or token store. Every case runs the real entry point in a process of its own (forked from
the test worker's fork server, tests/forkserver.py, or a fresh interpreter where the case needs one)."""

from __future__ import annotations

import gzip
import random
import resource
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from tests.helpers import TINY, describe, run

pytestmark = pytest.mark.slow


@dataclass
class Made:
    """The files the cases point at (built once per test process)."""
    root: Path
    ckpt: Path = field(init=False)

    def __post_init__(self):
        self.ckpt = self.root / "run" / "last.ckpt"

    def __truediv__(self, name: str) -> Path:
        return self.root / name


def write_pair(folder: Path, en: list[str] | bytes, de: list[str] | bytes, gz: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        for lang, lines in (("en", en), ("de", de)):
            data = lines if isinstance(lines, bytes) else "".join(f"{line}\n" for line in lines).encode()
            path = folder / f"{split}.{lang}{'.gz' if gz else ''}"
            path.write_bytes(gzip.compress(data) if gz and not isinstance(lines, bytes) else data)
    return folder


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Made:
    m = Made(tmp_path_factory.mktemp("user_errors"))
    rng = random.Random(0)
    words = [f"w{i}" for i in range(60)]
    good = [" ".join(rng.choices(words, k=rng.randint(3, 9))) for _ in range(200)]
    write_pair(m / "good", good, good)
    write_pair(m / "misaligned", good, good[:-1])
    write_pair(m / "empty", [], [])
    write_pair(m / "not_utf8", good, b"w1 w2\n\xff\xfe w3\n" * 100)
    text = "".join(f"{line}\n" for line in good).encode()
    corrupt = gzip.compress(text)
    write_pair(m / "bad_gzip", corrupt[: len(corrupt) // 2], good, gz=True)  # the .de.gz files are whole
    (m / "a_file").write_text("a file where a folder should be\n")
    (m / "not_a_checkpoint.ckpt").write_text("hello\n")
    (m / "long_input.txt").write_text(" ".join(["w1"] * 3000) + "\nw2 w3\n")
    (m / "one_reference.txt").write_text("w1\n")
    trained = run("train.py", [*TINY, "trainer.max_steps=2", "trainer.max_epochs=-1", "run_test=false",
                               "trainer.limit_val_batches=1", f"hydra.run.dir={m / 'run_dir'}"], m / "logs")
    assert trained.returncode == 0, describe(trained)
    (m / "run").mkdir()
    (m / "run_dir" / "checkpoints" / "last.ckpt").rename(m.ckpt)
    whole = m.ckpt.read_bytes()
    (m / "truncated.ckpt").write_bytes(whole[: len(whole) // 2])
    ckpt = torch.load(m.ckpt, map_location="cpu", weights_only=False)
    del ckpt["seqmix"]["tokenizer"]
    torch.save(ckpt, m / "no_tokenizer.ckpt")
    return m


@dataclass(frozen=True)
class Case:
    name: str
    script: str
    args: object  # Made -> list[str]
    needles: tuple[str, ...]
    env: tuple = ()
    file_size_limit: int | None = None  # bytes: writes beyond it fail as on a full disk


MULTI30K = ["task=multi30k_ende", "logger=csv", "task.vocab_size=100", "~callbacks.progress_bar"]


def data_run(folder: str, *more: str):
    return lambda m: [*MULTI30K, f"task.data.source.path={m / folder}", *more]


CASES = [
    # --- the config: Hydra's composition -------------------------------------------------------------------
    Case("unknown model choice", "train.py", lambda m: ["model=dynamicconv_smal"],
         ("model=dynamicconv_smal", "did you mean dynamicconv_small", "choose one of")),
    Case("unknown mixer choice", "train.py", lambda m: ["mixer=no_such_mixer"],
         ("mixer=no_such_mixer", "choose one of", "lightconv")),
    # issue 35: the choice was silently ignored (ConvS2S has no mixer-group layers)
    Case("a mixer choice with a ConvS2S model", "train.py", lambda m: ["model=convs2s_small", "mixer=lightconv"],
         ("mixer=lightconv does nothing with model=convs2s_small", "GLU", "model=transformer_small mixer=lightconv")),
    Case("misspelled key", "train.py", lambda m: [*TINY, "trainer.max_epoch=3"],
         ("trainer.max_epoch", "did you mean trainer.max_epochs", "+trainer.max_epoch=3")),
    Case("override that does not parse", "train.py", lambda m: [*TINY, "trainer.max_epochs=["],
         ("cannot parse the override 'trainer.max_epochs=['", "quote")),
    Case("misspelled mixer option", "train.py", lambda m: [*TINY, "mixer=lightconv",
                                                           "model.encoder.mixer.kernel_sise=3"],
         ("model.encoder.mixer.kernel_sise", "did you mean model.encoder.mixer.kernel_size")),
    Case("mixer option that does not exist, added with +", "train.py",
         lambda m: [*TINY, "+model.encoder.mixer.no_such_option=1"], ("does not take ['no_such_option']",)),
    Case("kernel_backend=triton without CUDA", "train.py",
         lambda m: [*TINY, "mixer=lightconv", "model.encoder.mixer.kernel_backend=triton"],
         ("kernel_backend=triton needs a CUDA GPU",), env=(("CUDA_VISIBLE_DEVICES", ""), ("TRITON_INTERPRET", None))),
    Case("heads that do not divide the width", "train.py", lambda m: [*TINY, "model.encoder.heads=3"],
         ("embed_dim=32 must be divisible by num_heads=3",)),
    Case("learning rate below zero", "train.py", lambda m: [*TINY, "optim.lr=-1"],
         ("optim.lr=-1: must be a finite number > 0",)),
    Case("precision Lightning does not know", "train.py", lambda m: [*TINY, "trainer.precision=bogus"],
         ("trainer.precision='bogus'", "must be one of", "bf16-mixed")),  # the schema's, before Lightning's
    # found by tests/test_fuzz_configs.py: an empty layer list passed the schema and crashed the stack
    Case("an empty list of layers for a transformer stack", "train.py", lambda m: [*TINY, "model.decoder.layers=[]"],
         ("model.decoder.layers=[]", "must be")),
    Case("misspelled monitored metric", "train.py",
         lambda m: [*TINY, "callbacks.best_checkpoint.monitor=val/blue", "trainer.max_steps=4", "trainer.max_epochs=-1",
                    "trainer.val_check_interval=2", "trainer.limit_val_batches=1"],
         ("monitor='val/blue'", "fix that setting")),
    Case("validation interval longer than the epoch", "train.py",
         lambda m: [*TINY, "trainer.val_check_interval=100000"], ("val_check_interval", "training batches")),
    Case("pictures folder that cannot be created", "train.py",
         lambda m: [*TINY, "trainer.max_epochs=1", "callbacks.dashboard.pictures_dir=/proc/seqmix_pictures"],
         ("/proc/seqmix_pictures", "check the path")),
    Case("a negative checkpoint interval", "train.py", lambda m: [*TINY, "save_interval_updates=-100"],
         ("save_interval_updates=-100", ">= 0")),
    Case("keeping no interval checkpoints", "train.py",
         lambda m: [*TINY, "save_interval_updates=100", "keep_interval_updates=0"],
         ("keep_interval_updates=0", "-1 (keep all)")),
    Case("a string as the learning rate", "train.py", lambda m: [*TINY, "optim.lr=fast"],
         ("optim.lr='fast': must be a finite number > 0",)),
    Case("a tokenizer kind that does not exist", "train.py", lambda m: [*TINY, "+task.data.tokenizer.kind=unigram"],
         ("task.data.tokenizer.kind='unigram'", "'bpe', 'word'")),
    Case("nonfinite policy that does not exist", "train.py", lambda m: [*TINY, "nonfinite=ignore"],
         ("nonfinite='ignore': must be one of ['raise', 'skip']",)),
    # --- the data -------------------------------------------------------------------------------------------
    Case("missing data folder", "train.py", data_run("nowhere"), ("nowhere", "task.data.source.path")),
    Case("streaming a saved dataset", "train.py",
         lambda m: ["task=wmt_ende", "task.data.source.streaming=true", f"task.data.source.load_from_disk={m / 'run'}",
                    "logger=csv", "task.vocab_size=100"], ("streaming=true", "load_from_disk=null")),
    Case("a load_from_disk folder that does not exist", "train.py",
         lambda m: ["task=wmt_ende", f"task.data.source.load_from_disk={m / 'no_saved_dataset'}", "logger=csv",
                    "~callbacks.progress_bar"],
         ("load_from_disk=", "no_saved_dataset: that local folder does not exist", "save_to_disk")),
    Case("misaligned data files", "train.py", data_run("misaligned"), ("has 200 lines", "has 199")),
    Case("empty data files", "train.py", data_run("empty"), ("empty",)),
    Case("data file that is not UTF-8", "train.py", data_run("not_utf8"), ("not UTF-8", "line 2")),
    Case("corrupt gzip data file", "train.py", data_run("bad_gzip"), ("not a valid gzip file", "train.en.gz")),
    Case("vocabulary too small for the specials", "train.py", data_run("good", "task.vocab_size=3"),
         ("vocab_size=3 is too small",)),
    Case("max positions below the data", "train.py",
         data_run("good", "model.max_source_positions=4", "model.max_target_positions=4"),
         ("longer than max_source_positions=4", "max_skipped_fraction")),
    Case("token budget below one example", "train.py", lambda m: [*TINY, "task.data.max_tokens=2"],
         ("max_tokens=2 is smaller than one example",)),
    # --- checkpoints and the run folder ---------------------------------------------------------------------
    Case("resume from a missing checkpoint", "train.py", lambda m: [*TINY, f"ckpt_path={m / 'missing.ckpt'}"],
         ("does not exist",)),
    Case("resume from a truncated checkpoint", "train.py", lambda m: [*TINY, f"ckpt_path={m / 'truncated.ckpt'}"],
         ("unreadable or corrupt",)),
    Case("resume a checkpoint of another model", "train.py",
         lambda m: [*TINY, "model.embed_dim=48", f"ckpt_path={m.ckpt}"], ("does not fit this model", "shape")),
    Case("resume a checkpoint of another task", "train.py", data_run("good", "ckpt_path=CKPT"),
         ("was trained on task toy_reverse", "this run is task multi30k_ende")),
    Case("run folder holding a run with other settings", "train.py",
         lambda m: [*TINY, "model.embed_dim=48", f"hydra.run.dir={m / 'run_dir'}"],
         ("already holds a run with other settings", "model.embed_dim=32 (here: 48)", "its own folder")),
    Case("resume a checkpoint with another decoder start", "train.py",
         lambda m: [*TINY, "model.decoder_start=bos", f"ckpt_path={m.ckpt}"],
         ("trained with model.decoder_start=eos", "pass model.decoder_start=eos")),
    Case("ckpt_path and init_from together", "train.py",
         lambda m: [*TINY, f"ckpt_path={m.ckpt}", f"init_from={m.ckpt}"], ("pass one of them",)),
    Case("init_encoder_from with init_from", "train.py",
         lambda m: [*TINY, f"init_from={m.ckpt}", f"init_encoder_from={m.ckpt}"], ("would be overwritten",)),
    Case("init_encoder_from an encoder of another size", "train.py",
         lambda m: [*TINY, "model.encoder.layers=2", f"init_encoder_from={m.ckpt}"],
         ("built with other settings", "model.encoder.layers=1")),
    Case("run folder that cannot be created", "train.py", lambda m: [*TINY, f"hydra.run.dir={m / 'a_file'}/run"],
         ("Not a directory", "a_file")),
    Case("disk full while writing a checkpoint", "train.py",
         lambda m: [*TINY, "trainer.max_steps=2", "trainer.max_epochs=-1", "run_test=false"],
         ("could not write checkpoint", "nothing half-written"), file_size_limit=150_000),
    Case("a loss that becomes non-finite", "train.py",
         lambda m: [*TINY, "optim.lr=1e30", "scheduler=constant", "trainer.max_steps=20"],
         ("non-finite", "lower optim.lr")),
    # --- generate.py ----------------------------------------------------------------------------------------
    Case("generate without a checkpoint", "generate.py", lambda m: [], ("ckpt_path has no value",)),
    Case("generate from a file that is not a checkpoint", "generate.py",
         lambda m: [f"ckpt_path={m / 'not_a_checkpoint.ckpt'}"], ("unreadable or corrupt",)),
    Case("generate from a checkpoint without its tokenizer", "generate.py",
         lambda m: [f"ckpt_path={m / 'no_tokenizer.ckpt'}"], ("not a complete seqmix checkpoint", "no tokenizer")),
    Case("generate a split the task lacks", "generate.py", lambda m: ["ckpt_path=CKPT", "split=dev"],
         ("no 'dev' split",)),
    Case("generate from a missing input file", "generate.py",
         lambda m: ["ckpt_path=CKPT", f"input={m / 'missing.txt'}"], ("does not exist",)),
    Case("generate with beam size 0", "generate.py", lambda m: ["ckpt_path=CKPT", "beam_size=0"],
         ("beam_size=0: must be a whole number >= 1",)),
    Case("average more checkpoints than were kept", "generate.py", lambda m: ["ckpt_path=CKPT", "average_last=9"],
         ("average_last=9", "holds only")),
    Case("average more interval checkpoints than were kept", "generate.py",
         lambda m: ["ckpt_path=CKPT", "average_last=2", "average_updates=true"],
         ("average_last=2 average_updates=true", "holds only 0 interval checkpoints", "save_interval_updates=")),
    Case("input line longer than the model's positions", "generate.py",
         lambda m: ["ckpt_path=CKPT", f"input={m / 'long_input.txt'}"], ("longer than the model's max_source",)),
    Case("references misaligned with the input", "generate.py",
         lambda m: ["ckpt_path=CKPT", f"input={m / 'long_input.txt'}", f"reference={m / 'one_reference.txt'}"],
         ("has 2 lines", "has 1")),
    # found by tests/test_fuzz_commands.py: a binary input file was an internal error
    Case("input file that is not UTF-8", "generate.py",
         lambda m: ["ckpt_path=CKPT", f"input={m / 'not_utf8' / 'train.de'}"], ("not UTF-8 text", "line 2")),
    Case("hypotheses file under a file", "generate.py",
         lambda m: ["ckpt_path=CKPT", f"output={m / 'a_file'}/hyp.txt"], ("a_file",)),
    Case("decoding device this machine lacks", "generate.py", lambda m: ["ckpt_path=CKPT", "device=cuda"],
         ("device=cuda is not usable here",), env=(("CUDA_VISIBLE_DEVICES", ""),)),
    Case("misspelled generate option", "generate.py", lambda m: ["ckpt_path=CKPT", "beam_sise=3"],
         ("beam_sise", "did you mean beam_size")),
    # issue 36: n-best lists, sampling and forced prefixes that cannot be served
    Case("an n-best list longer than the beam", "generate.py", lambda m: ["ckpt_path=CKPT", "nbest=5", "beam_size=2"],
         ("nbest=5 is more than the beam keeps (beam_size=2)", "raise beam_size")),
    Case("sampling together with a beam", "generate.py",
         lambda m: ["ckpt_path=CKPT", "sampling=true", "beam_size=5"], ("drop beam_size=5", "nbest=N gives N samples")),
    Case("a forced prefix without references", "generate.py",
         lambda m: ["ckpt_path=CKPT", f"input={m / 'one_reference.txt'}", "prefix_size=1"],
         ("prefix_size=1", "give reference=<file>")),
    Case("an unknown output format", "generate.py", lambda m: ["ckpt_path=CKPT", "output_format=xml"],
         ("output_format='xml'", "'jsonl'")),
    # --- preprocess.py --------------------------------------------------------------------------------------
    Case("preprocess an unknown task", "preprocess.py", lambda m: ["task=multi30k_ende_x"],
         ("task=multi30k_ende_x", "did you mean multi30k_ende")),
    Case("preprocess missing data", "preprocess.py", data_run("nowhere"), ("nowhere",)),
    Case("preprocess data that is not UTF-8", "preprocess.py", data_run("not_utf8"), ("not UTF-8",)),
    Case("preprocess into a cache folder that cannot be created", "preprocess.py",
         data_run("good", "paths.cache_dir=A_FILE/cache"), ("a_file",)),
    # --- the side commands (python -m ...); found by tests/test_fuzz_commands.py ------------------------------
    Case("a side command's unknown option", "seqmix.report", lambda m: [str(m / "run_dir"), "--metrc", "score"],
         ("unrecognized arguments: --metrc", "-h` shows the usage")),
    Case("report on a folder that is a file", "seqmix.report", lambda m: [str(m / "a_file")], ("a_file",)),
    Case("export a checkpoint over an existing file", "seqmix.interop.fairseq",
         lambda m: ["export", "CKPT", "--out", "A_FILE"], ("a_file",)),
    Case("import a file that is not a fairseq checkpoint", "seqmix.interop.fairseq",
         lambda m: ["import", str(m / "not_a_checkpoint.ckpt"), "--data-dir", str(m / "good"), "--out",
                    str(m / "imported.ckpt")], ("not_a_checkpoint.ckpt",)),
]


def _arguments(case: Case, m: Made) -> list[str]:
    return [a.replace("CKPT", str(m.ckpt)).replace("A_FILE", str(m / "a_file")) for a in case.args(m)]


def _limit_file_size(limit: int):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_there_are_at_least_25_distinct_cases():
    assert len({c.name for c in CASES}) == len(CASES) >= 25


@pytest.mark.parametrize("case", CASES, ids=[c.name.replace(" ", "_") for c in CASES])
def test_a_user_error_ends_in_one_clear_line(case: Case, made: Made, tmp_path):
    logs, cache = tmp_path / "logs", tmp_path / "cache"
    env = {"SEQMIX_CACHE_DIR": str(cache), **dict(case.env)}
    proc = run(case.script, _arguments(case, made), logs, env=env,
               preexec_fn=_limit_file_size(case.file_size_limit) if case.file_size_limit else None)
    assert proc.returncode == 2, describe(proc)
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output, describe(proc)
    errors = [line for line in output.splitlines() if "seqmix: error:" in line]
    assert len(errors) == 1 and errors[0].startswith("seqmix: error: "), describe(proc)
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert last == errors[0], describe(proc)  # the error is the last thing said
    for needle in case.needles:
        assert needle in errors[0], f"{needle!r} not in: {errors[0]}"
    left = sorted(p for p in logs.rglob("*") if p.is_file())
    assert not [p for p in left if p.suffix in (".ckpt", ".tmp") or p.name.startswith("hyp.")], left
    runs = logs / "runs"
    assert not runs.exists() or not any(runs.iterdir()), f"a failed run left {list(runs.iterdir())}"
    assert not list(cache.rglob("*.tmp")), "an unfinished token store was left behind"
    assert not (made / "run_dir" / "FAILED").exists(), "another run's folder was marked as failed"
