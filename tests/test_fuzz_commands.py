"""Property: any command a user types, with any of the files they may point it at, ends in success or in one
``seqmix: error:`` line (exit status 2, the last thing said, no traceback), never an internal error or a crash.
Commands: train.py (short runs on the built-in task, with resume and init_from), generate.py, preprocess.py,
``python -m seqmix.report``, ``python -m seqmix.interop.fairseq import|export``, ``python -m seqmix.average``; paths: a good checkpoint, a truncated
one, a text file, an empty file, random bytes, a folder, a missing path, a path under a file; plus right and wrong
option values. Each path or value slot gets a right one half the time, so working runs are drawn as well as
refusals; a success must leave whole outputs (a finished run record, last.ckpt, one hypothesis per input line), a
failure nothing half-written and no run that says running.

`make test` runs a fixed, derandomized sample (COMMAND_FUZZ_EXAMPLES, default 12); `make fuzz` runs 500.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests import forkserver
from tests.helpers import ROOT, TINY, describe, run

pytestmark = pytest.mark.slow
EXAMPLES = int(os.environ.get("COMMAND_FUZZ_EXAMPLES", "12"))
PATHS = ["good.ckpt", "truncated.ckpt", "text.txt", "empty", "random.bin", "folder", "missing", "text.txt/below"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("zoo")
    trained = run("train.py", [*TINY, "trainer.max_steps=2", "trainer.max_epochs=-1", "run_test=false",
                               "trainer.limit_val_batches=1", f"hydra.run.dir={root / 'run'}"], root / "logs")
    assert trained.returncode == 0, describe(trained)
    whole = (root / "run" / "checkpoints" / "last.ckpt").read_bytes()
    (root / "good.ckpt").write_bytes(whole)
    (root / "truncated.ckpt").write_bytes(whole[: len(whole) // 3])
    (root / "text.txt").write_text("w1 w2 w3\nw4\n")
    (root / "empty").write_bytes(b"")
    (root / "random.bin").write_bytes(random.Random(0).randbytes(4096))
    (root / "folder").mkdir()
    (root / "folder" / "train.en").write_text("w1 w2\n" * 20)
    return root


paths = st.sampled_from(PATHS)
# a slot a user fills rightly half the time: the draw reaches working runs, not only early refusals
checkpoints = st.one_of(st.just("good.ckpt"), paths)
inputs = st.one_of(st.just("text.txt"), paths)
outputs = st.one_of(st.just("fresh.txt"), paths)  # fresh: a new file in a new folder
wrong_values = st.sampled_from(["0", "-1", "abc", "''", "nan", "[1]", "null", "true", "1e30"])


def number(*right: str):
    """A number slot: one of ``right`` half the time, else a wrong value."""
    return st.one_of(st.sampled_from(right), wrong_values)


def placed(paths_):
    return paths_.map(lambda name: f"@{name}@")


# the options each command's draw picks from (up to 2 for train.py, 3 for generate.py), and how each is filled
TRAIN_OPTIONS = {
    "init_from": placed(checkpoints), "ckpt_path": placed(checkpoints),
    "resume": st.sampled_from(["never", "auto", "sometimes"]), "optim.lr": number("1e-3", "5e-4"),
    "seed": number("0", "7"), "trainer.val_check_interval": number("1", "2", "0.5", "100000"),
    "task.data.max_tokens": number("64", "512"), "label_smoothing": number("0.0", "0.2"),
    "trainer.gradient_clip_val": number("0.1", "null"),
}
GENERATE_OPTIONS = {
    "input": placed(inputs), "output": placed(outputs), "split": st.sampled_from(["valid", "test", "train", "bogus"]),
    "device": st.sampled_from(["cpu", "cuda", "tpu7"]), "beam_size": number("1", "2", "5"),
    "average_last": number("0", "1"), "max_tokens": number("64", "8000"), "len_penalty": number("0.5", "1.0", "2"),
}
TRAIN_BASE = [*TINY, "trainer.max_steps=3", "trainer.max_epochs=-1", "run_test=false", "trainer.limit_val_batches=1"]


def options(draw, slots: dict, most: int) -> list[str]:
    keys = draw(st.lists(st.sampled_from(sorted(slots)), max_size=most, unique=True))
    return [f"{key}={draw(slots[key])}" for key in keys]


@st.composite
def commands(draw) -> tuple[str, bool, list[str]]:
    """(script or module, is a module, arguments with @path@ placeholders for the zoo's files)."""
    kind = draw(st.sampled_from(["train", "generate", "generate", "preprocess", "report", "import", "export",
                                 "average", "ctranslate2"]))
    if kind == "train":
        return "train.py", False, [*TRAIN_BASE, "hydra.run.dir=@work@/run", *options(draw, TRAIN_OPTIONS, 2)]
    if kind == "generate":
        return "generate.py", False, [f"ckpt_path=@{draw(checkpoints)}@", *options(draw, GENERATE_OPTIONS, 3)]
    if kind == "preprocess":
        return "preprocess.py", False, ["task=multi30k_ende", "task.vocab_size=60",
                                        f"task.data.source.path=@{draw(st.one_of(st.just('folder'), paths))}@",
                                        f"paths.cache_dir=@{draw(st.one_of(st.just('new'), paths))}@/cache"]
    if kind == "average":  # listed checkpoints, or the trained run's folder with --last
        listed = draw(st.booleans())
        inputs_ = draw(st.lists(placed(checkpoints), min_size=1, max_size=3)) if listed else \
            ["@run@", "--last", draw(number("1", "2"))]
        return "seqmix.average", True, [*inputs_, "--out", f"@{draw(outputs)}@"]
    if kind == "report":
        return "seqmix.report", True, [f"@{draw(paths)}@",
                                       *draw(st.sampled_from([[], ["--metric", "best_valid"], ["--metric", "x"]]))]
    if kind == "import":
        return "seqmix.interop.fairseq", True, ["import", f"@{draw(paths)}@", "--data-dir", f"@{draw(paths)}@",
                                                "--out", f"@{draw(paths)}@"]
    if kind == "ctranslate2":
        return "seqmix.interop.ctranslate2", True, ["export", f"@{draw(checkpoints)}@", "--out",
                                                    f"@{draw(st.one_of(st.just('new'), paths))}@/ct2",
                                                    *draw(st.sampled_from([[], ["--quantization", "int8"]]))]
    return "seqmix.interop.fairseq", True, ["export", f"@{draw(checkpoints)}@", "--out",
                                            f"@{draw(st.one_of(st.just('new'), paths))}@/out"]


def check_outputs(script: str, args: list[str], work: Path, succeeded: bool) -> None:
    """A success leaves its outputs whole; a failure leaves nothing half-written and no run that says running."""
    left = [p for p in work.rglob("*") if p.is_file()]
    assert not [p for p in left if p.name.endswith(".tmp") or ".tmp." in p.name], left
    for record in work.rglob("run.json"):
        status = json.loads(record.read_text())["status"]
        assert status == ("finished" if succeeded else "failed"), record
    if not succeeded:
        assert not [p for p in left if p.name.startswith("hyp.") or p.name == "interrupted.ckpt"], left
        return
    if script == "train.py":
        assert (work / "run" / "checkpoints" / "last.ckpt").is_file()
        assert json.loads((work / "run" / "run.json").read_text())["status"] == "finished"
    if script == "seqmix.average":
        assert torch.load(args[args.index("--out") + 1], weights_only=False)["seqmix"]["averaged_from"]
    if script == "generate.py":
        output = next((a.split("=", 1)[1] for a in args if a.startswith("output=")), None)
        source = next((a.split("=", 1)[1] for a in args if a.startswith("input=")), None)
        if output and source:  # one hypothesis per input line
            assert len(Path(output).read_text().splitlines()) == len(Path(source).read_text().splitlines())


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(command=commands())
def test_a_command_succeeds_or_ends_in_one_user_error(zoo, tmp_path_factory, command):
    script, module, args = command
    work = tmp_path_factory.mktemp("cmd")
    places = {"work": work, "new": work / "new", "fresh.txt": work / "new" / "hyp.txt", "run": zoo / "run",
              **{name: zoo / name for name in PATHS}}
    for name, path in places.items():
        args = [a.replace(f"@{name}@", str(path)) for a in args]
    env = {**os.environ, "SEQMIX_LOG_DIR": str(work / "logs"), "SEQMIX_CACHE_DIR": str(work / "cache"),
           "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    proc = forkserver.server().run(script if module else ROOT / script, args, work, env, 300, module=module)
    event(f"{script.split('.')[-1] if module else script} -> exit {proc.returncode}")
    output = proc.stdout + proc.stderr
    assert proc.returncode in (0, 2), describe(proc)
    assert "Traceback" not in output, describe(proc)
    if proc.returncode == 2:
        errors = [line for line in output.splitlines() if "seqmix: error:" in line]
        last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
        assert len(errors) == 1 and last == errors[0], describe(proc)
    check_outputs(script, args, work, proc.returncode == 0)
