"""``generate.py input=-``: lines typed on stdin are translated one at a time as they arrive (the first answer comes
back before the second line is written), with the same tokenizer and decoding settings as a file."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

from tests.helpers import ROOT, TINY, run


def test_two_stdin_lines_are_translated_as_they_arrive(tmp_path):
    train = run("train.py", [*TINY, "trainer.max_epochs=2", "run_test=false"], tmp_path / "t")
    assert train.returncode == 0, train.stderr[-3000:]
    (ckpt,) = (tmp_path / "t").rglob("best.ckpt")
    lines = ["a b c d e", "f g h"]
    (tmp_path / "in.txt").write_text("\n".join(lines) + "\n")
    batch = run("generate.py", [f"ckpt_path={ckpt}", f"input={tmp_path / 'in.txt'}", f"output={tmp_path / 'o.txt'}",
                                "beam_size=2"], tmp_path / "g")
    assert batch.returncode == 0, batch.stderr[-3000:]
    expected = (tmp_path / "o.txt").read_text().splitlines()
    env = {**os.environ, "SEQMIX_LOG_DIR": str(tmp_path / "i"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, str(ROOT / "generate.py"), f"ckpt_path={ckpt}", "input=-",
                             "beam_size=2"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=tmp_path)
    watchdog = threading.Timer(300, proc.kill)  # a stalled answer fails the test instead of hanging it
    watchdog.start()
    try:
        answers = []
        for line in lines:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            answers.append(proc.stdout.readline().rstrip("\n"))  # blocks until this line's answer: streaming
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-3000:]
    finally:
        watchdog.cancel()
        proc.kill()
    assert answers == expected and rest == ""
