import gzip
import json
import os
from pathlib import Path

import pytest

from seqmix.data.sources import HFParallelSource, LocalParallelSource, ParallelCorpus, ToyReverseSource
from seqmix.errors import SeqmixError

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before `datasets` is imported: never touch the network
os.environ["HF_HUB_OFFLINE"] = "1"

SRC = ["A dog runs.", "  leading spaces kept", "trailing space ", "NBSP\u00a0here", "tab\there", "é ü ß"]
TGT = ["Ein Hund rennt.", "  Leerzeichen", "Leerzeichen ", "NBSP\u00a0hier", "Tab\thier", "é ü ß"]


@pytest.fixture
def multi30k(multi30k_dir):
    return multi30k_dir


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write(path: Path, lines: list[str], gz: bool = False, eol: str = "\n") -> Path:
    data = "".join(line + eol for line in lines).encode("utf-8")
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def test_corpus_must_be_aligned():
    with pytest.raises(ValueError):
        ParallelCorpus(["a"], [])


def test_plain_gz_and_crlf_read_identically(tmp_path):
    plain, zipped, crlf = tmp_path / "plain", tmp_path / "zipped", tmp_path / "crlf"
    for d in (plain, zipped, crlf):
        d.mkdir()
    write(plain / "train.en", SRC), write(plain / "train.de", TGT)
    write(zipped / "train.en", SRC, gz=True), write(zipped / "train.de", TGT, gz=True)
    write(crlf / "train.en", SRC, eol="\r\n"), write(crlf / "train.de", TGT, eol="\r\n")
    got = [LocalParallelSource(str(d), "en", "de").read("train") for d in (plain, zipped, crlf)]
    assert got[0] == got[1] == got[2] == ParallelCorpus(SRC, TGT)  # only the newline is stripped


def test_custom_pattern_and_available_splits(tmp_path):
    for split in ("train", "dev"):
        write(tmp_path / f"{split}-en.txt", SRC)
        write(tmp_path / f"{split}-de.txt", TGT, gz=True)
    write(tmp_path / "orphan-en.txt", SRC)  # no German side: not a split
    source = LocalParallelSource(str(tmp_path), "en", "de", pattern="{split}-{lang}.txt")
    assert source.available_splits() == ["dev", "train"]
    assert source.read("dev").tgt == TGT


def test_missing_directory_names_the_setting(tmp_path):
    with pytest.raises(SeqmixError, match=r"does not exist; set task\.data\.source\.path="):
        LocalParallelSource(str(tmp_path / "nope"), "en", "de").read("train")


def test_missing_split_lists_present_files(tmp_path):
    write(tmp_path / "train.en", SRC), write(tmp_path / "train.de", TGT, gz=True)
    with pytest.raises(SeqmixError) as err:
        LocalParallelSource(str(tmp_path), "en", "de").read("valid")
    msg = str(err.value)
    assert "valid.en" in msg and "train.de.gz" in msg and "train.en" in msg


def test_mismatched_line_counts_name_both_files(tmp_path):
    write(tmp_path / "train.en", SRC), write(tmp_path / "train.de", TGT[:-1])
    with pytest.raises(SeqmixError) as err:
        LocalParallelSource(str(tmp_path), "en", "de").read("train")
    msg = str(err.value)
    assert "train.en" in msg and "train.de" in msg and f"{len(SRC)} lines" in msg and f"{len(SRC) - 1}" in msg


def test_empty_file(tmp_path):
    write(tmp_path / "train.en", SRC)
    (tmp_path / "train.de").write_bytes(b"")
    with pytest.raises(SeqmixError, match=r"train\.de is empty"):
        LocalParallelSource(str(tmp_path), "en", "de").read("train")


def test_not_utf8(tmp_path):
    write(tmp_path / "train.en", SRC)
    (tmp_path / "train.de").write_bytes("Grüße\n".encode("latin-1"))
    with pytest.raises(SeqmixError, match="not UTF-8"):
        LocalParallelSource(str(tmp_path), "en", "de").read("train")


def test_fingerprint_tracks_content(tmp_path):
    write(tmp_path / "train.en", SRC), write(tmp_path / "train.de", TGT)
    source = LocalParallelSource(str(tmp_path), "en", "de")
    before = source.fingerprint("train")
    assert before == source.fingerprint("train")
    write(tmp_path / "train.de", TGT[:-1] + ["changed"])
    assert source.fingerprint("train") != before
    assert LocalParallelSource(str(tmp_path), "de", "en").fingerprint("train") != source.fingerprint("train")


def test_multi30k_reads_raw_text(multi30k):
    source = LocalParallelSource(str(multi30k), "en", "de")
    assert source.available_splits() == ["train", "val"]
    train, val = source.read("train"), source.read("val")
    assert (len(train), len(val)) == (29000, 1014)
    assert train.src[0] == "Two young, White males are outside near many bushes."
    assert sum(line.endswith(" ") for line in train.tgt) == 40  # source quirks survive reading
    assert sum("\u00a0" in line for line in val.tgt) == 1


# ---- Hugging Face -------------------------------------------------------------------------------------------


def local_source(tmp_path) -> LocalParallelSource:
    d = tmp_path / "local"
    d.mkdir()
    for split in ("train", "valid"):
        write(d / f"{split}.en", SRC), write(d / f"{split}.de", TGT)
    return LocalParallelSource(str(d), "en", "de")


def test_hf_load_from_disk_nested_records(tmp_path):
    import datasets

    records = [{"en": s, "de": t} for s, t in zip(SRC, TGT)]
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"translation": records}),
                               "validation": datasets.Dataset.from_dict({"translation": records})})
    dd.save_to_disk(str(tmp_path / "saved"))
    hf = HFParallelSource(None, "en", "de", load_from_disk=str(tmp_path / "saved"),
                          split_names={"valid": "validation"})
    local = local_source(tmp_path)
    assert hf.read("train") == local.read("train")
    assert hf.read("valid") == local.read("valid")
    assert HFParallelSource(None, "de", "en", load_from_disk=str(tmp_path / "saved")).read("train").src == TGT
    with pytest.raises(SeqmixError, match=r"no split 'test'.*\['train', 'validation'\]"):
        hf.read("test")
    with pytest.raises(SeqmixError, match="no language 'fr'"):
        HFParallelSource(None, "en", "fr", load_from_disk=str(tmp_path / "saved")).read("train")


def test_hf_json_data_files_flat_and_nested(tmp_path):
    nested, flat = tmp_path / "nested.jsonl", tmp_path / "flat.jsonl"
    nested.write_text("".join(json.dumps({"translation": {"en": s, "de": t}}) + "\n" for s, t in zip(SRC, TGT)))
    flat.write_text("".join(json.dumps({"en": s, "de": t, "id": i}) + "\n" for i, (s, t) in enumerate(zip(SRC, TGT))))
    expected = local_source(tmp_path).read("train")
    cache = str(tmp_path / "hf_cache")
    for f in (nested, flat):
        hf = HFParallelSource("json", "en", "de", data_files={"train": str(f)}, cache_dir=cache)
        assert hf.read("train") == expected
        assert hf.available_splits() == ["train"]


def test_hf_missing_columns(tmp_path):
    f = tmp_path / "other.jsonl"
    f.write_text(json.dumps({"text": "x"}) + "\n")
    hf = HFParallelSource("json", "en", "de", data_files={"train": str(f)}, cache_dir=str(tmp_path / "c"))
    with pytest.raises(SeqmixError, match=r"neither a 'translation' column nor a 'en' column"):
        hf.read("train")


def test_hf_offline_failure_says_what_to_do(tmp_path):
    hf = HFParallelSource("seqmix-no-such-org/no-such-dataset", "en", "de", cache_dir=str(tmp_path / "c"))
    with pytest.raises(SeqmixError) as err:
        hf.read("train")
    msg = str(err.value)
    assert "no-such-dataset" in msg and "unreachable" in msg and "load_from_disk" in msg and "data_files" in msg


def test_hf_load_from_disk_errors_are_about_the_local_folder_not_the_hub(tmp_path):
    """A load_from_disk folder is local: its errors say the folder is missing (or holds no saved dataset) and how
    one is written, not that the hub may be unreachable."""
    (tmp_path / "not_saved").mkdir()
    (tmp_path / "not_saved" / "notes.txt").write_text("x\n")
    for folder, needle in (("missing", "that local folder does not exist"), ("not_saved", "could not load a dataset")):
        with pytest.raises(SeqmixError) as err:
            HFParallelSource(None, "en", "de", load_from_disk=str(tmp_path / folder)).read("train")
        msg = str(err.value)
        assert f"load_from_disk={tmp_path / folder}" in msg and needle in msg and "save_to_disk" in msg, msg
        assert "hub" not in msg and "unreachable" not in msg, msg


def test_hf_needs_a_dataset():
    with pytest.raises(SeqmixError, match="load_from_disk"):
        HFParallelSource(None, "en", "de")


# ---- toy ----------------------------------------------------------------------------------------------------


def test_toy_reverse_is_deterministic_and_reversed():
    toy = ToyReverseSource(num_train=200, num_valid=50, num_test=50, vocab_size=30, min_len=2, max_len=5, seed=7)
    train = toy.read("train")
    assert train == ToyReverseSource(num_train=200, vocab_size=30, min_len=2, max_len=5, seed=7).read("train")
    assert len(train) == 200 and len(toy.read("valid")) == 50 and len(toy.read("test")) == 50
    for s, t in zip(train.src, train.tgt):
        words = s.split(" ")
        assert t.split(" ") == words[::-1] and 2 <= len(words) <= 5
        assert all(w.isalpha() and w.islower() for w in words)
    assert len(set(toy.words)) == 30
    assert toy.read("valid").src != toy.read("test").src[: len(toy.read("valid"))]
    assert ToyReverseSource(num_train=200, seed=8).read("train").src != ToyReverseSource(num_train=200, seed=7).read(
        "train").src
    assert len(set(ToyReverseSource(vocab_size=500).words)) == 500  # beyond one syllable per word
    with pytest.raises(SeqmixError, match="splits"):
        toy.read("val")
