"""``python -m seqmix.report``: a real 2×2 multirun (one setting deliberately diverging) becomes the right table,
with the failed jobs listed; seeds group as mean ± std; unfinished and never-started jobs are listed, not dropped."""

from __future__ import annotations

import csv
import json
import statistics

import pytest
import yaml

from seqmix.report import report
from tests.helpers import TINY, run


def describe(proc) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def test_a_real_multirun_becomes_a_table_with_its_failed_jobs(tmp_path):
    # 2 mixers × 2 learning rates; lr 1e30 makes the loss non-finite: those two jobs fail with a user error
    proc = run("train.py", ["-m", "mixer=self_attention,lightconv", "optim.lr=0.001,1e30", "scheduler=constant",
                            *TINY, "trainer.max_steps=12", "trainer.max_epochs=-1", "run_test=true",
                            "trainer.limit_val_batches=1", "tags=[sweep_test]"], tmp_path, timeout=900)
    assert proc.returncode == 2 and "non-finite" in proc.stderr, describe(proc)
    sweep = next((tmp_path / "multiruns").iterdir())
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1", "2", "3"]  # failed jobs' folders kept
    records = {p.name: json.loads((p / "run.json").read_text()) for p in sweep.iterdir() if p.is_dir()}
    assert {n: r["status"] for n, r in records.items()} == {"0": "finished", "1": "failed", "2": "finished",
                                                             "3": "failed"}
    assert records["0"]["tags"] == ["sweep_test"] and "optim.lr=0.001" in records["0"]["overrides"]
    assert records["1"]["error"].startswith("the loss became non-finite") or "non-finite" in records["1"]["error"]

    cli = run("seqmix.report", [str(sweep)], tmp_path / "report")
    assert cli.returncode == 0, describe(cli)
    lines = cli.stdout.splitlines()
    assert lines[0].startswith("| mixer | optim.lr | jobs | status | BLEU | parameters |")
    by_job = {line.split("|")[-2].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in lines[2:]}
    assert set(by_job) == {"0", "1", "2", "3"}
    for job in ("0", "2"):
        row, record = by_job[job], records[job]
        assert row[:4] == [("self_attention" if job == "0" else "lightconv"), "0.001", "1", "finished"]
        assert float(row[4]) == round(record["score"], 2)
        assert row[5] == f"{record['parameters']:,}" and row[6] == str(record["updates"]) == "12"
    for job in ("1", "3"):
        assert by_job[job][1] == "1e+30" and by_job[job][3].startswith("failed: ") and "non-finite" in by_job[job][3]
        assert by_job[job][4] == ""
    assert records["0"]["parameters"] != records["2"]["parameters"]  # the mixers differ in size
    rows = list(csv.reader((sweep / "report.csv").open()))
    assert rows[0][:3] == ["mixer", "optim.lr", "jobs"] and len(rows) == 5
    assert (sweep / "report.png").read_bytes()[:4] == b"\x89PNG"
    assert (sweep / "report.md").read_text() == cli.stdout


def fake_job(sweep, name: str, overrides: list[str], record: dict | None) -> None:
    (sweep / name / ".hydra").mkdir(parents=True)
    (sweep / name / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    if record is not None:
        (sweep / name / "run.json").write_text(json.dumps(record))


def test_seeds_group_as_mean_and_std_and_unfinished_jobs_are_listed(tmp_path):
    sweep = tmp_path / "sweep"
    done = {"status": "finished", "score_name": "BLEU", "parameters": 1000, "updates": 10, "tokens_per_s": 50.0,
            "wall_seconds": 60.0}
    fake_job(sweep, "0", ["mixer=lightconv", "seed=1"], {**done, "score": 30.0})
    fake_job(sweep, "1", ["mixer=lightconv", "seed=2"], {**done, "score": 32.0})
    fake_job(sweep, "2", ["mixer=dynamicconv", "seed=1"], {**done, "score": 31.0, "parameters": 1200})
    fake_job(sweep, "3", ["mixer=dynamicconv", "seed=2"], {"status": "running"})  # killed: left "running"
    (sweep / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {
        "overrides": {"task": ["mixer=lightconv,dynamicconv,talk", "seed=1,2"]}, "sweeper": {"params": None}}}))
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in report(sweep).splitlines()[2:]]
    assert rows[0] == ["lightconv", "2", "finished", f"31.00 ± {statistics.stdev([30.0, 32.0]):.2f}", "1,000",
                       "10", "50", "1.0", "0, 1"]
    assert rows[1][:4] == ["dynamicconv", "1", "finished", "31.00"]
    assert rows[2][0] == "dynamicconv" and rows[2][2] == "unfinished" and rows[2][-1] == "3"
    assert [(r[0], r[2]) for r in rows[3:]] == [("talk", "not started"), ("talk", "not started")]

    # by the best validation score: the column says which metric the checkpoints were chosen by
    for name, value in (("0", 29.0), ("1", 31.5), ("2", 30.0)):
        record = json.loads((sweep / name / "run.json").read_text())
        (sweep / name / "run.json").write_text(json.dumps({**record, "best_valid": value, "monitor": "val/bleu"}))
    lines = report(sweep, metric="best_valid").splitlines()
    assert lines[0].split("|")[4].strip() == "best val/bleu" and lines[0].split("|")[-2].strip() == "folders"
    assert [c.strip() for c in lines[2].split("|")[1:-1]][3] == f"30.25 ± {statistics.stdev([29.0, 31.5]):.2f}"


def test_a_folder_without_jobs_is_one_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run("seqmix.report", [str(tmp_path / "empty")], tmp_path / "report")
    assert proc.returncode == 2 and proc.stderr.startswith("seqmix: error:") and len(proc.stderr.splitlines()) == 1


def test_a_wrong_option_is_one_seqmix_error_line_not_argparse_usage(tmp_path, capsys):
    """Found by tests/test_fuzz_commands.py: argparse's usage block and its own error line, not one seqmix line."""
    from seqmix.report import main

    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path), "--metric", "x"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith("seqmix: error: argument --metric: invalid choice: 'x'") and "seqmix.report -h" in err


def test_a_damaged_overrides_file_is_named_in_one_line(tmp_path):
    sweep = tmp_path / "sweep"
    fake_job(sweep, "0", ["seed=1"], {"status": "finished", "score": 1.0})
    (sweep / "0" / ".hydra" / "overrides.yaml").write_text("- seed=1\n- [unclosed\n")
    proc = run("seqmix.report", [str(sweep)], tmp_path / "report")
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"seqmix: error: {sweep / '0' / '.hydra' / 'overrides.yaml'} is damaged")
