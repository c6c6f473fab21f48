"""An error that is not the user's (a bug) ends in one ``seqmix: internal error:`` line naming the file that holds
its traceback, exit status 1; the run folder is cleaned up or its record says failed; a sweep with a failed job
runs the other jobs and ends in one summary line."""

from __future__ import annotations

import json
import re
from pathlib import Path

from seqmix.config.user_errors import command_status
from tests.faults.crashing_mixer import MESSAGE
from tests.helpers import TINY, describe, run

CRASH = "model.encoder.mixer._target_=tests.faults.crashing_mixer.CrashingMixer"
INTERNAL = re.compile(r"^seqmix: internal error: RuntimeError: " + MESSAGE + r" .*traceback is in (\S+):")


def traceback_file(line: str) -> Path:
    match = INTERNAL.match(line)
    assert match, line
    return Path(match.group(1))


def test_a_bug_during_training_ends_in_one_line_and_a_traceback_file(tmp_path):
    proc = run("train.py", [*TINY, CRASH, "trainer.max_steps=2", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert proc.returncode == 1, describe(proc)
    assert "Traceback" not in proc.stderr, describe(proc)
    last = proc.stderr.strip().splitlines()[-1]
    trace = traceback_file(last)
    assert trace.is_file() and trace.parent == tmp_path / "errors"  # <paths.log_dir>/errors
    text = trace.read_text()
    assert text.startswith("Traceback") and MESSAGE in text and "crashing_mixer.py" in text
    assert not (tmp_path / "run").exists()  # it never trained: nothing of value was left
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_sweep_runs_past_a_failed_job_and_names_it_at_the_end(tmp_path):
    proc = run("train.py", ["-m", *TINY, "trainer.max_steps=2", "run_test=false", "trainer.limit_val_batches=1",
                            "model.encoder.mixer._target_=seqmix.mixers.SelfAttention,"
                            "tests.faults.crashing_mixer.CrashingMixer"], tmp_path, timeout=900)
    assert proc.returncode == 1, describe(proc)
    assert "Traceback" not in proc.stderr, describe(proc)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("seqmix:")]
    assert len(lines) == 2, describe(proc)
    assert traceback_file(lines[0]).is_file() and "[job: " in lines[0] and "CrashingMixer" in lines[0]
    assert lines[1].startswith("seqmix: error: 1 job(s) of the sweep failed") and "CrashingMixer" in lines[1]
    assert proc.stderr.strip().splitlines()[-1] == lines[1]
    sweep = next((tmp_path / "multiruns").iterdir())
    records = {p.parent.name: json.loads(p.read_text()) for p in sweep.glob("*/run.json")}
    assert records["0"]["status"] == "finished" and records["1"]["status"] == "failed"
    assert records["1"]["error"].startswith("seqmix: internal error: RuntimeError")


def test_a_side_command_bug_is_one_line_and_status_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SEQMIX_LOG_DIR", str(tmp_path))

    def buggy():
        raise RuntimeError(MESSAGE)

    assert command_status(buggy) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and traceback_file(err[0]).parent == tmp_path / "errors"
