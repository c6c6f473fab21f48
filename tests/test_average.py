"""``python -m seqmix.average``: the written checkpoint holds the float64 mean of the chosen checkpoints' weights
(checked against a hand average), decodes like ``generate.py average_last=N`` on the fly, carries no training
state, and mismatched models or an existing output are refused in one line with nothing written."""

from __future__ import annotations

import pytest
import torch

from seqmix.config.build import build_task, load_task
from seqmix.data.tokenizer import train_tokenizer
from seqmix.interop.fairseq import save_seqmix_checkpoint
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
