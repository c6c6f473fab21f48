"""End to end through the entry points, tiny: an autoregressive teacher distils the toy training split with
generate.py, DisCo trains on the distilled files (validation on the real references), generate.py decodes it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import TINY, describe, run

pytestmark = pytest.mark.slow

NAT = ["model.max_source_positions=32", "model.max_target_positions=32", "task.nat.length_beam=2"]


def best_checkpoint(log_dir: Path) -> Path:
    return next(p for p in sorted(log_dir.rglob("*.ckpt")) if p.name == "best.ckpt")


def test_distil_train_disco_and_decode(tmp_path):
    teacher = run("train.py", [*TINY, "trainer.max_epochs=1", "run_test=false"], tmp_path / "teacher")
    assert teacher.returncode == 0, describe(teacher)
    kd = tmp_path / "kd"
    gen = run("generate.py", [f"ckpt_path={best_checkpoint(tmp_path / 'teacher')}", "split=train", "beam_size=5",
                              f"distill_dir={kd}"], tmp_path / "distil")
    assert gen.returncode == 0, describe(gen)
    src, tgt = (kd / "train.src").read_text().splitlines(), (kd / "train.tgt").read_text().splitlines()
    hyps = Path(next(x for x in gen.stdout.splitlines() if x.startswith("hypotheses: ")).split(": ")[1])
    assert len(src) == len(tgt) == 400 and tgt == hyps.read_text().splitlines()

    source = ["task.data.source._target_=seqmix.data.distilled.DistilledTrainSource",
              "+task.data.source.base_target=seqmix.data.ToyReverseSource", "+task.data.source.src_lang=src",
              "+task.data.source.tgt_lang=tgt", f"+task.data.source.distilled_path={kd}"]
    student = run("train.py", [*TINY, *NAT, *source, "model=disco", "trainer.max_epochs=1"], tmp_path / "student")
    assert student.returncode == 0, describe(student)
    assert "test BLEU:" in student.stdout and "average iterations:" in student.stdout, describe(student)
    assert "easy_first (max iterations 10, length beam 2)" in student.stdout

    dec = run("generate.py", [f"ckpt_path={best_checkpoint(tmp_path / 'student')}", "split=valid",
                              "algorithm=mask_predict", "max_iterations=3"], tmp_path / "decode")
    assert dec.returncode == 0, describe(dec)
    assert "average iterations: 3.00" in dec.stdout and "sacreBLEU: nrefs:1" in dec.stdout, describe(dec)
    line = next(x for x in dec.stdout.splitlines() if x.startswith("decoding: "))  # the settings it used
    assert "iterative algorithm=mask_predict" in line and "max_iterations=3" in line, line
    hyps = Path(next(x for x in dec.stdout.splitlines() if x.startswith("hypotheses: ")).split(": ")[1])
    assert len(hyps.read_text().splitlines()) == 40


def test_cmlm_rejects_easy_first_with_a_clear_message(tmp_path):
    proc = run("train.py", [*TINY, *NAT, "model=cmlm", "task.nat.algorithm=easy_first", "trainer.max_epochs=1"],
               tmp_path)
    assert proc.returncode == 2, describe(proc)
    assert "seqmix: error: parallel easy-first needs per-query contexts (model=disco)" in proc.stderr
    assert "Traceback" not in proc.stderr
