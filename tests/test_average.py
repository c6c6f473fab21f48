"""``python -m seqmix.average``: the written checkpoint holds the float64 mean of the chosen checkpoints' weights
(checked against a hand average), decodes like ``generate.py average_last=N`` on the fly, carries no training
state, and mismatched models or an existing output are refused in one line with nothing written. A train.py run with
save_interval_updates keeps its newest interval checkpoints, each resuming as last.ckpt does; their average (--updates)
is their float64 mean, decodes like average_updates=true on the fly and exports to fairseq with its weights."""

from __future__ import annotations

import pytest
import torch

from seqmix.config.build import build_task, load_task
from seqmix.data.tokenizer import train_tokenizer
from seqmix.interop.fairseq import import_checkpoint, save_seqmix_checkpoint
from tests.helpers import TINY as HELPER_TINY
from tests.helpers import describe, run, run_config

pytestmark = pytest.mark.slow
TINY = ["model=transformer_small", "model.embed_dim=16", "model.encoder.layers=1", "model.decoder.layers=1",
        "model.encoder.ffn_dim=32", "model.decoder.ffn_dim=32", "model.encoder.heads=2", "model.decoder.heads=2",
        "model.decoder.cross_attention_heads=2"]


def tiny_task(width: int = 16):
    tokenizer = train_tokenizer(["a b c d e f g h", "h g f e d c b a"] * 20, vocab_size=40)
    return build_task(run_config([*TINY, f"model.embed_dim={width}"]), tokenizer)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run folder with three epoch checkpoints of one model, each with other random weights."""
    folder = tmp_path_factory.mktemp("run")
    task = tiny_task()
    for i, step in enumerate((10, 20, 30)):
        torch.manual_seed(i)
        for p in task.model.parameters():
            p.data.normal_()
        save_seqmix_checkpoint(folder / "checkpoints" / f"epoch{i:03d}-step{step}.ckpt", task,
                               {"optimizer_states": [{"state": "x"}], "global_step": step})
    return folder


def average(args, cwd):
    return run("seqmix.average", [str(a) for a in args], cwd)


def test_the_average_of_the_last_two_is_their_float64_mean_and_decodes_like_averaging_on_the_fly(run_dir, tmp_path):
    proc = average([run_dir, "--last", "2", "--out", tmp_path / "avg.ckpt"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert "epoch001-step20.ckpt, epoch002-step30.ckpt" in proc.stdout
    written = torch.load(tmp_path / "avg.ckpt", weights_only=False)
    assert not {"optimizer_states", "lr_schedulers", "loops", "callbacks"} & set(written)
    assert written["seqmix"]["averaged_from"] == ["epoch001-step20.ckpt", "epoch002-step30.ckpt"]
    a, b = (torch.load(run_dir / "checkpoints" / name, weights_only=False)["state_dict"]
            for name in ("epoch001-step20.ckpt", "epoch002-step30.ckpt"))
    for key, value in written["state_dict"].items():
        hand = ((a[key].double() + b[key].double()) / 2).to(value.dtype) if value.is_floating_point() else b[key]
        assert torch.equal(value, hand), key
    from_file, _ = load_task(tmp_path / "avg.ckpt")
    on_the_fly, _ = load_task(run_dir / "checkpoints" / "epoch002-step30.ckpt", average_last=2)
    assert from_file.evaluate_texts(["a b c", "h g"], None, 8000) == on_the_fly.evaluate_texts(["a b c", "h g"],
                                                                                                None, 8000)


def test_listed_files_are_averaged_and_an_existing_output_is_never_overwritten(run_dir, tmp_path):
    files = [run_dir / "checkpoints" / f"epoch00{i}-step{s}.ckpt" for i, s in ((0, 10), (2, 30))]
    assert average([*files, "--out", tmp_path / "avg.ckpt"], tmp_path).returncode == 0
    before = (tmp_path / "avg.ckpt").read_bytes()
    proc = average([*files, "--out", tmp_path / "avg.ckpt"], tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("seqmix: error: "), describe(proc)
    assert "exists" in proc.stderr and (tmp_path / "avg.ckpt").read_bytes() == before


@pytest.mark.parametrize("case", ["other model", "folder without --last", "more than were kept"])
def test_mistakes_end_in_one_line_and_write_nothing(case, run_dir, tmp_path):
    if case == "other model":
        save_seqmix_checkpoint(tmp_path / "wide.ckpt", tiny_task(width=24))
        args, needle = [run_dir / "checkpoints" / "epoch000-step10.ckpt", tmp_path / "wide.ckpt"], "differ"
    elif case == "folder without --last":
        args, needle = [run_dir], "--last N"
    else:
        args, needle = [run_dir, "--last", "5"], "--last 5 but"
    proc = average([*args, "--out", tmp_path / "avg.ckpt"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, describe(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("seqmix: error:")]
    assert len(errors) == 1 and needle in errors[0], describe(proc)
    assert not (tmp_path / "avg.ckpt").exists()


INTERVAL_RUN = [*HELPER_TINY, "task.data.max_tokens=512", "trainer.max_steps=9", "trainer.max_epochs=-1",
                "run_test=false", "trainer.limit_val_batches=1", "model.dropout=0.1", "trainer.accumulate_grad_batches=2",
                "save_interval_updates=2", "keep_interval_updates=3"]


def train_interval_run(folder, *extra):
    proc = run("train.py", [*INTERVAL_RUN, f"hydra.run.dir={folder / 'run'}", *extra], folder / "logs")
    assert proc.returncode == 0, describe(proc)
    return folder / "run" / "checkpoints"


@pytest.fixture(scope="module")
def interval_run(tmp_path_factory):
    """A train.py run of 9 updates (2 batches each) saving every 2 updates, the newest 3 kept."""
    return train_interval_run(tmp_path_factory.mktemp("interval"))


def state(path):
    return torch.load(path, weights_only=False)


def test_a_run_keeps_the_newest_interval_checkpoints_and_each_resumes_like_last_ckpt(interval_run, tmp_path):
    assert sorted(p.name for p in interval_run.glob("update*")) == [f"update{u:07d}.ckpt" for u in (4, 6, 8)]
    assert [state(interval_run / f"update{u:07d}.ckpt")["global_step"] for u in (4, 6, 8)] == [4, 6, 8]
    resumed = train_interval_run(tmp_path, f"ckpt_path={interval_run / 'update0000006.ckpt'}")
    assert sorted(p.name for p in resumed.glob("update*")) == ["update0000008.ckpt"]
    for name in ("update0000008.ckpt", "last.ckpt"):  # the same updates on the same batches: bitwise the same
        ours, theirs = state(resumed / name), state(interval_run / name)
        assert ours["global_step"] == theirs["global_step"]
        assert all(torch.equal(ours["state_dict"][k], v) for k, v in theirs["state_dict"].items()), name


def test_the_average_of_the_last_two_updates_is_their_mean_and_decodes_and_exports(interval_run, tmp_path):
    proc = average([interval_run.parent, "--updates", "--last", "2", "--out", tmp_path / "avg.ckpt"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    assert "update0000006.ckpt, update0000008.ckpt" in proc.stdout
    written = state(tmp_path / "avg.ckpt")
    a, b = (state(interval_run / f"update{u:07d}.ckpt")["state_dict"] for u in (6, 8))
    assert any(not torch.equal(a[k], b[k]) for k in a)
    for key, value in written["state_dict"].items():
        hand = ((a[key].double() + b[key].double()) / 2).to(value.dtype) if value.is_floating_point() else b[key]
        assert torch.equal(value, hand), key
    hyps = []
    for name, args in (("file", [f"ckpt_path={tmp_path / 'avg.ckpt'}"]),
                       ("on the fly", [f"ckpt_path={interval_run / 'last.ckpt'}", "average_last=2",
                                       "average_updates=true"])):
        proc = run("generate.py", [*args, "split=valid", f"output={tmp_path / name}.txt"], tmp_path / name)
        assert proc.returncode == 0 and "BLEU" in proc.stdout, describe(proc)
        hyps.append((tmp_path / f"{name}.txt").read_text())
    assert hyps[0] == hyps[1] and hyps[0].strip()
    proc = run("seqmix.interop.fairseq", ["export", str(tmp_path / "avg.ckpt"), "--out", str(tmp_path / "fairseq")],
               tmp_path)
    assert proc.returncode == 0, describe(proc)
    import_checkpoint(tmp_path / "fairseq" / "checkpoint.pt", tmp_path / "fairseq", tmp_path / "back.ckpt")
    back = {k: v for k, v in state(tmp_path / "back.ckpt")["state_dict"].items() if k.startswith("model.")}
    model = {k: v for k, v in written["state_dict"].items() if k.startswith("model.")}
    assert sorted(back) == sorted(model) and all(torch.equal(back[k], v) for k, v in model.items())


@pytest.mark.parametrize("case", ["more than were kept", "files with --updates"])
def test_interval_mistakes_end_in_one_line_and_write_nothing(case, interval_run, tmp_path):
    if case == "more than were kept":
        args, needles = [interval_run.parent, "--updates", "--last", "4"], (
            "holds only 3 interval checkpoints", "keep_interval_updates>=4")
    else:
        args, needles = [*sorted(interval_run.glob("update*")), "--updates"], ("--updates picks from one folder",)
    proc = average([*args, "--out", tmp_path / "avg.ckpt"], tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, describe(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("seqmix: error:")]
    assert len(errors) == 1 and all(n in errors[0] for n in needles), describe(proc)
    assert not (tmp_path / "avg.ckpt").exists()
