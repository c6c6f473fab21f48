"""``task.data.tokenizer.file``: a run takes another run's vocabulary (a tokenizer.json, or the tokenizer inside a
seqmix checkpoint) instead of learning one from its own train split, as a student trained on its teacher's
translations must to share the teacher's weights; a missing or foreign file is one clear error."""

from __future__ import annotations

import gzip

import pytest
import torch

from seqmix.data.sources import LocalParallelSource
from seqmix.data.tokenizer import given_tokenizer
from seqmix.data.translation_datamodule import TranslationDataModule
from seqmix.errors import SeqmixError

SETTINGS = {"vocab_size": 600, "min_frequency": 2}


def module(folder, cache, **tokenizer):
    return TranslationDataModule(LocalParallelSource(str(folder), "en", "de"), "en", "de",
                                 {"train": "train", "valid": "val", "test": None}, {**SETTINGS, **tokenizer},
                                 max_tokens=2048, cache_dir=str(cache))


@pytest.fixture(scope="module")
def corpora(multi30k_dir, tmp_path_factory):
    """The teacher's data (Multi30k val as its train split) and a student's: the same sources, other targets."""
    root = tmp_path_factory.mktemp("given")
    lines = {lang: gzip.open(multi30k_dir / f"val.{lang}.gz", "rt", encoding="utf-8").read().splitlines()
             for lang in ("en", "de")}
    for name, targets in (("teacher", lines["de"]), ("student", [" ".join(t.split()[:4]) for t in lines["de"]])):
        (root / name).mkdir()
        for split in ("train", "val"):
            (root / name / f"{split}.en").write_text("\n".join(lines["en"]) + "\n", encoding="utf-8")
            (root / name / f"{split}.de").write_text("\n".join(targets if split == "train" else lines["de"]) + "\n",
                                                     encoding="utf-8")
    teacher = module(root / "teacher", root / "cache")
    teacher.setup("fit")
    json_file, ckpt_file = root / "tokenizer.json", root / "teacher.ckpt"
    teacher.tokenizer.save(json_file)
    torch.save({"state_dict": {}, "seqmix": {"tokenizer": teacher.tokenizer.to_json()}}, ckpt_file)
    return root, teacher.tokenizer, json_file, ckpt_file


def test_a_student_learns_its_own_vocabulary_without_the_file(corpora):
    root, taught, _, _ = corpora
    own = module(root / "student", root / "cache")
    own.setup("fit")
    assert own.tokenizer.content_hash() != taught.content_hash()


@pytest.mark.parametrize("which", ["json", "checkpoint"])
def test_the_given_vocabulary_encodes_the_students_data(corpora, which):
    root, taught, json_file, ckpt_file = corpora
    given = module(root / "student", root / f"cache_{which}", file=str(json_file if which == "json" else ckpt_file))
    given.setup("fit")
    assert given.tokenizer.content_hash() == taught.content_hash()
    first = given.datasets["train"][0]
    source = (root / "student" / "train.en").read_text(encoding="utf-8").splitlines()[0]
    assert torch.equal(torch.as_tensor(first["source"])[:-1], torch.as_tensor(taught.encode(source)))


def test_a_missing_or_foreign_file_is_named(tmp_path):
    with pytest.raises(SeqmixError, match="does not exist"):
        given_tokenizer(tmp_path / "none.ckpt")
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(SeqmixError, match="neither a tokenizer.json nor a seqmix checkpoint"):
        given_tokenizer(tmp_path / "junk.ckpt")
    torch.save({"state_dict": {}}, tmp_path / "bare.ckpt")
    with pytest.raises(SeqmixError, match="neither.*KeyError"):
        given_tokenizer(tmp_path / "bare.ckpt")
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(SeqmixError, match="not a seqmix tokenizer file"):
        given_tokenizer(tmp_path / "t.json")
