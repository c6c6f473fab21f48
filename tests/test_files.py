"""atomic_write_text: readers see the old file or the whole new one, and a failed write leaves no temp file."""

from __future__ import annotations

import os

import pytest

from seqmix.files import atomic_write_text


def test_writes_creating_parent_folders_and_replaces_whole(tmp_path):
    path = tmp_path / "a" / "b" / "hyp.valid.txt"
    atomic_write_text(path, "first version, longer than the next\n")
    atomic_write_text(path, "second\n")
    assert path.read_text(encoding="utf-8") == "second\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["hyp.valid.txt"]


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch, failing):
    path = tmp_path / "tokenizer.json"
    atomic_write_text(path, "old")

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, failing, boom)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_text(path, "new " * 1000)
    monkeypatch.undo()
    assert path.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o027, 0o640)])
def test_written_files_get_the_permissions_open_would_give(tmp_path, umask, mode):
    """Not the temp file's private 0600: a checkpoint shared on a cluster stays readable by the group."""
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "checkpoint.pt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "checkpoint.pt").stat().st_mode & 0o777 == mode
