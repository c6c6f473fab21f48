"""Property: any command a user types, with any of the files they may point it at, ends in success or in one
``seqmix: error:`` line (exit status 2, the last thing said, no traceback), never an internal error or a crash.
Commands: generate.py, preprocess.py, ``python -m seqmix.report``, ``python -m seqmix.interop.fairseq
import|export``; paths: a good checkpoint, a truncated one, a text file, an empty file, random bytes, a folder,
a missing path, a path under a file; plus right and wrong option values.

`make test` runs a fixed, derandomized sample (COMMAND_FUZZ_EXAMPLES, default 12); `make fuzz` runs 500.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
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
values = st.sampled_from(["1", "0", "-1", "5", "abc", "''", "nan", "[1]", "null", "true"])


@st.composite
def commands(draw) -> tuple[str, bool, list[str]]:
    """(script or module, is a module, arguments with @path@ placeholders for the zoo's files)."""
    kind = draw(st.sampled_from(["generate", "preprocess", "report", "import", "export"]))
    if kind == "generate":
        args = [f"ckpt_path=@{draw(paths)}@"]
        for key in draw(st.lists(st.sampled_from(["input", "output", "split", "beam_size", "average_last", "device",
                                                  "max_tokens", "len_penalty"]), max_size=3, unique=True)):
            if key in ("input", "output"):
                args.append(f"{key}=@{draw(paths)}@")
            elif key == "split":
                args.append(f"split={draw(st.sampled_from(['valid', 'test', 'train', 'bogus']))}")
            elif key == "device":
                args.append(f"device={draw(st.sampled_from(['cpu', 'cuda', 'tpu7']))}")
            else:
                args.append(f"{key}={draw(values)}")
        return "generate.py", False, args
    if kind == "preprocess":
        return "preprocess.py", False, ["task=multi30k_ende", "task.vocab_size=60",
                                        f"task.data.source.path=@{draw(paths)}@",
                                        f"paths.cache_dir=@{draw(paths)}@/cache"]
    if kind == "report":
        return "seqmix.report", True, [f"@{draw(paths)}@",
                                       *draw(st.sampled_from([[], ["--metric", "best_valid"], ["--metric", "x"]]))]
    if kind == "import":
        return "seqmix.interop.fairseq", True, ["import", f"@{draw(paths)}@", "--data-dir", f"@{draw(paths)}@",
                                                "--out", f"@{draw(paths)}@"]
    return "seqmix.interop.fairseq", True, ["export", f"@{draw(paths)}@", "--out", f"@{draw(paths)}@/out"]


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(command=commands())
def test_a_command_succeeds_or_ends_in_one_user_error(zoo, tmp_path_factory, command):
    script, module, args = command
    work = tmp_path_factory.mktemp("cmd")
    for name in PATHS:
        args = [a.replace(f"@{name}@", str(zoo / name)) for a in args]
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
