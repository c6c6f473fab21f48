"""Checkpoints: starting a run from another checkpoint's weights (only an exact fit loads, with one clear message
otherwise); a checkpoint write killed midway leaves the previous checkpoint; a corrupt resume checkpoint is
reported with the newest good one beside it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from seqmix.errors import SeqmixError
from seqmix.training.checkpoints import AtomicCheckpointIO, check_resumable, load_checkpoint, load_weights


class Vocabulary:
    def __init__(self, text: str) -> None:
        self.text = text

    def to_json(self) -> str:
        return self.text


class TinyTask(nn.Module):
    def __init__(self, vocabulary: str, width: int = 4) -> None:
        super().__init__()
        self.tokenizer = Vocabulary(vocabulary)
        self.proj = nn.Linear(width, 3)


CONFIG = {"task": {"name": "tiny"}, "model": {"name": "tiny"}}  # what a checkpoint's run config must hold at least


def save(tmp_path, task: TinyTask) -> str:
    path = tmp_path / "source.ckpt"
    torch.save({"state_dict": task.state_dict(), "seqmix": {"config": CONFIG, "tokenizer": task.tokenizer.to_json()}},
               path)
    return str(path)


def test_weights_load_when_vocabulary_names_and_shapes_match(tmp_path):
    source, target = TinyTask('{"v": 1}'), TinyTask('{"v": 1}')
    load_weights(target, save(tmp_path, source))
    torch.testing.assert_close(target.proj.weight, source.proj.weight, rtol=0, atol=0)


@pytest.mark.parametrize("target,needle", [(TinyTask('{"v": 2}'), "vocabulary differs"),
                                           (TinyTask('{"v": 1}', width=5), "shape (3, 4) vs (3, 5)")])
def test_a_different_vocabulary_or_shape_is_refused(tmp_path, target, needle):
    before = target.proj.weight.clone()
    with pytest.raises(SeqmixError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_weights(target, save(tmp_path, TinyTask('{"v": 1}')))
    assert torch.equal(target.proj.weight, before)


def resumable(step: int) -> dict:
    return {"state_dict": {"w": torch.full((3,), float(step))}, "seqmix": {"config": CONFIG, "tokenizer": "{}"},
            "optimizer_states": [], "loops": {}, "global_step": step}


KILLED_WRITER = """
import os, signal, sys, torch
from seqmix.files import atomic_write
def write(f):
    f.write(b"PK" + b"x" * 100_000)  # the start of a new checkpoint...
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # ...and the process dies mid-write
atomic_write(sys.argv[1], write)
"""


def test_a_checkpoint_write_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    path = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint(resumable(6), path)
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert torch.load(path, weights_only=False)["global_step"] == 6
    assert [p.name for p in tmp_path.glob("*.ckpt")] == ["last.ckpt"]  # the temp file is not a checkpoint
    orphans = list(tmp_path.glob(".last.ckpt.*.tmp"))
    assert len(orphans) == 1 and orphans[0].stat().st_size >= 100_000  # what the kill left behind
    check_resumable(path)  # resuming removes it
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_a_full_disk_keeps_the_previous_checkpoint_and_says_what_to_do(tmp_path, monkeypatch):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint(resumable(6), path)

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(SeqmixError, match="free some disk space.*ckpt_path="):
        io.save_checkpoint(resumable(9), path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False)["global_step"] == 6
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_a_corrupt_resume_checkpoint_names_the_newest_good_one_beside_it(tmp_path):
    for step in (4, 8):
        torch.save(resumable(step), tmp_path / f"epoch{step:03d}-step{step}.ckpt")
        time.sleep(0.01)
    (tmp_path / "weights-only.ckpt").write_bytes(b"")  # newer, but not resumable either
    last = tmp_path / "last.ckpt"
    last.write_bytes(torch.save.__name__.encode() * 10)  # cut short / garbage
    with pytest.raises(SeqmixError, match=r"corrupt.*resume with ckpt_path=.*epoch008-step8\.ckpt$"):
        check_resumable(last)
    for p in tmp_path.glob("epoch*.ckpt"):
        p.unlink()
    with pytest.raises(SeqmixError, match="corrupt") as raised:
        check_resumable(last)
    assert "newest good" not in str(raised.value)


@pytest.mark.parametrize("broken,needle", [
    ({"seqmix": {"config": CONFIG, "tokenizer": "{}"}}, "no model weights"),
    ({"state_dict": {}}, "no seqmix entry"),
    ({"state_dict": {}, "seqmix": {"tokenizer": "{}"}}, "no run config"),
    ({"state_dict": {}, "seqmix": {"config": {"task": {"name": "t"}}, "tokenizer": "{}"}}, "no model settings"),
    ({"state_dict": {}, "seqmix": {"config": CONFIG}}, "no tokenizer"),
    ({"state_dict": {}, "seqmix": {"config": CONFIG, "tokenizer": "{}", "format": 7}}, "checkpoint format 7"),
    ([1, 2, 3], "holds a list, not a checkpoint"),
])
def test_an_incomplete_checkpoint_is_refused_naming_what_it_lacks(tmp_path, broken, needle):
    path = tmp_path / "broken.ckpt"
    torch.save(broken, path)
    with pytest.raises(SeqmixError, match=f"not a complete seqmix checkpoint .*{needle}"):
        load_checkpoint(path)
