"""Every source streams its splits with ``iter_chunks``: chunks concatenate to ``read`` (and to the old whole-file
semantics), respect ``chunk_size``, and raise the same errors; fingerprints are streamed file hashes."""

from __future__ import annotations

import gzip
import hashlib
import json
import os

import numpy as np
import pytest

from seqmix.data import sources as sources_mod
from seqmix.data.distilled import DistilledTrainSource
from seqmix.data.sources import (
    SPLITS,
    HFParallelSource,
    LocalParallelSource,
    ParallelCorpus,
    ToyReverseSource,
    concat_chunks,
)
from seqmix.data.summary_sources import JsonlSummarySource
from seqmix.data.text_sources import HFTextSource, LocalTextSource, TextCorpus
from seqmix.errors import SeqmixError

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before `datasets` is imported: never touch the network
os.environ["HF_HUB_OFFLINE"] = "1"

# Awkward but legal lines: NBSP, U+2028, a lone CR inside a line, tabs, edge spaces, an empty line, multi-byte text.
TRICKY = ["plain", "NBSP\u00a0x", "sep\u2028x", "lone\rcr inside", "\ttab ", "", "  lead", "é ü ß 中文 🙂"]


def reference_lines(path) -> list[str]:
    """Today's (pre-streaming) semantics, written independently: whole file, split on LF, drop one trailing CR."""
    raw = path.read_bytes()
    if path.name.endswith(".gz"):
        raw = gzip.decompress(raw)
    lines = raw.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def write(path, lines, gz=False, eol="\n", final_eol=True):
    data = eol.join(lines) + (eol if final_eol else "")
    raw = data.encode("utf-8")
    if gz:
        path = path.with_name(path.name + ".gz")
        raw = gzip.compress(raw)
    path.write_bytes(raw)
    return path


def sizes(chunks) -> list[int]:
    return [len(c) for c in chunks]


def pairs(n: int) -> tuple[list[str], list[str]]:
    return [f"src {i} {TRICKY[i % len(TRICKY)]}" for i in range(n)], [f"tgt {i}" for i in range(n)]


@pytest.fixture
def small_blocks(monkeypatch):
    """Tiny read blocks, so block boundaries fall inside lines, CRLFs and multi-byte characters."""
    monkeypatch.setattr(sources_mod, "_BLOCK", 5)


# ---- local line files ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("eol", ["\n", "\r\n"])
@pytest.mark.parametrize("final_eol", [True, False])
@pytest.mark.parametrize("block", ["default", "small"])
def test_local_parallel_chunks_match_whole_file_semantics(tmp_path, request, gz, eol, final_eol, block):
    if block == "small":
        request.getfixturevalue("small_blocks")
    src, tgt = pairs(20)
    files = [write(tmp_path / f"train.{lang}", side, gz, eol, final_eol) for lang, side in (("en", src), ("de", tgt))]
    source = LocalParallelSource(str(tmp_path), "en", "de")
    chunks = list(source.iter_chunks("train", chunk_size=7))
    assert sizes(chunks) == [7, 7, 6]
    assert all(type(c) is ParallelCorpus and c.references is None for c in chunks)
    whole = concat_chunks(ParallelCorpus, chunks)
    assert whole == source.read("train") == ParallelCorpus(src, tgt)
    assert (whole.src, whole.tgt) == tuple(reference_lines(f) for f in files)


def test_local_text_chunks_keep_whitespace(tmp_path, small_blocks):
    lines = TRICKY * 3  # 24 lines
    write(tmp_path / "train.txt", lines, gz=True, eol="\r\n", final_eol=False)
    source = LocalTextSource(str(tmp_path))
    chunks = list(source.iter_chunks("train", chunk_size=10))
    assert sizes(chunks) == [10, 10, 4] and all(type(c) is TextCorpus for c in chunks)
    assert concat_chunks(TextCorpus, chunks) == source.read("train") == TextCorpus(lines)


def test_only_lf_splits_and_one_cr_is_dropped(tmp_path):
    (tmp_path / "train.txt").write_bytes(b"a\r\r\nb\rc\n\r\n\n\xe2\x80\xa8\nlast\r")
    assert LocalTextSource(str(tmp_path)).read("train").lines == ["a\r", "b\rc", "", "", "\u2028", "last"]


def test_chunk_sizes_and_bad_chunk_size(tmp_path):
    write(tmp_path / "train.txt", [str(i) for i in range(20)])
    source = LocalTextSource(str(tmp_path))
    assert sizes(source.iter_chunks("train", 7)) == [7, 7, 6]
    assert sizes(source.iter_chunks("train", 20)) == [20]
    assert sizes(source.iter_chunks("train", 1)) == [1] * 20
    assert sizes(source.iter_chunks("train")) == [20]
    for bad in (0, -3, 2.5):
        with pytest.raises(SeqmixError, match="chunk_size"):
            next(source.iter_chunks("train", bad))


@pytest.mark.parametrize("longer", ["src", "tgt"])
@pytest.mark.parametrize("short", [13, 14])  # ends inside a chunk / exactly at a chunk boundary
def test_mismatched_line_counts_raise_when_iterated(tmp_path, longer, short):
    src, tgt = pairs(20)
    if longer == "src":
        tgt = tgt[:short]
    else:
        src = src[:short]
    write(tmp_path / "train.en", src), write(tmp_path / "train.de", tgt, gz=True)
    chunks = LocalParallelSource(str(tmp_path), "en", "de").iter_chunks("train", chunk_size=7)
    assert len(next(chunks)) == 7  # streaming: the mismatch is only known when one side ends
    with pytest.raises(SeqmixError) as err:
        list(chunks)
    msg = str(err.value)
    assert f"train.en has {len(src)} lines but" in msg and f"train.de.gz has {len(tgt)};" in msg
    assert "equal line counts" in msg
    with pytest.raises(SeqmixError, match=f"has {len(src)} lines but .* has {len(tgt)};"):
        LocalParallelSource(str(tmp_path), "en", "de").read("train")


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("block", ["default", "small"])
def test_bad_utf8_names_file_and_line(tmp_path, request, gz, block):
    if block == "small":
        request.getfixturevalue("small_blocks")
    raw = "ok\nfine ü\n".encode() + "Grüße\n".encode("latin-1") + b"after\n"
    (tmp_path / "train.en").write_bytes(raw)
    name = "train.de.gz" if gz else "train.de"
    (tmp_path / name).write_bytes(gzip.compress(raw) if gz else raw)
    for side in ("en", "de"):
        source = LocalParallelSource(str(tmp_path), side, "en" if side == "de" else "de")
        with pytest.raises(SeqmixError, match=r"train\.(en|de|de\.gz) line 3 is not UTF-8 \(bad byte at offset 13\)"):
            list(source.iter_chunks("train", chunk_size=1))
    (tmp_path / "train.txt").write_bytes(b"x\n\xc3")  # cut inside a character, at the end of the file
    with pytest.raises(SeqmixError, match=r"train\.txt line 2 is not UTF-8"):
        LocalTextSource(str(tmp_path)).read("train")


def test_bad_gzip_names_the_file(tmp_path):
    good = gzip.compress(("hello world\n" * 5000).encode())
    corrupt = bytearray(good)
    corrupt[len(corrupt) // 2] ^= 0xFF
    for name, data in (("notgz", b"plain text\n"), ("truncated", good[:-9]), ("corrupt", bytes(corrupt))):
        (tmp_path / f"{name}.txt.gz").write_bytes(data)
        with pytest.raises(SeqmixError, match=rf"{name}\.txt\.gz is not a valid gzip file"):
            list(LocalTextSource(str(tmp_path)).iter_chunks(name, chunk_size=100))


def test_empty_files_are_errors(tmp_path):
    write(tmp_path / "train.en", ["a"]), (tmp_path / "train.de").write_bytes(b"")
    (tmp_path / "valid.en.gz").write_bytes(gzip.compress(b"")), write(tmp_path / "valid.de", ["a"])
    with pytest.raises(SeqmixError, match=r"train\.de is empty; it must hold one sentence per line"):
        list(LocalParallelSource(str(tmp_path), "en", "de").iter_chunks("train"))
    with pytest.raises(SeqmixError, match=r"valid\.en\.gz is empty"):
        list(LocalParallelSource(str(tmp_path), "en", "de").iter_chunks("valid"))
    (tmp_path / "test.jsonl").write_text("\n  \n\n")
    with pytest.raises(SeqmixError, match=r"test\.jsonl is empty; it must hold one record per line"):
        list(JsonlSummarySource(str(tmp_path), "d", ["s"]).iter_chunks("test"))


def test_local_fingerprints_are_streamed_file_hashes(tmp_path):
    big = os.urandom(3 * (1 << 20) + 123).hex().encode()  # several 1 MiB blocks
    (tmp_path / "train.en").write_bytes(big)
    write(tmp_path / "train.de", ["x"], gz=True)
    de = (tmp_path / "train.de.gz").read_bytes()
    parallel = LocalParallelSource(str(tmp_path), "en", "de")
    before = parallel.fingerprint("train")
    assert before == hashlib.sha256(b"en\0" + big + b"de\0" + de).hexdigest()
    (tmp_path / "train.txt").write_bytes(big)
    assert LocalTextSource(str(tmp_path)).fingerprint("train") == hashlib.sha256(big).hexdigest()
    (tmp_path / "train.jsonl").write_bytes(b'{"d": "x", "s": "y"}\n')
    expected = hashlib.sha256(json.dumps(["d", ["s"]]).encode() + b'{"d": "x", "s": "y"}\n').hexdigest()
    assert JsonlSummarySource(str(tmp_path), "d", ["s"]).fingerprint("train") == expected
    (tmp_path / "train.en").write_bytes(big[:-1] + b"0" if big[-1:] != b"0" else big[:-1] + b"1")
    assert parallel.fingerprint("train") != before


# ---- JSON lines ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_jsonl_chunks_keep_references_and_line_numbers(tmp_path, gz, small_blocks):
    records = [{"doc": f"d{i}\u2028x", "s1": f"s{i}", "s2": [f"t{i}", ""] if i % 3 else None} for i in range(20)]
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    lines.insert(5, "   ")  # blank lines are skipped, as before
    lines[9] = repr(records[8])  # a Python dict literal
    write(tmp_path / "train.jsonl", lines, gz=gz, eol="\r\n", final_eol=False)
    source = JsonlSummarySource(str(tmp_path), "doc", ["s1", "s2"])
    chunks = list(source.iter_chunks("train", chunk_size=7))
    assert sizes(chunks) == [7, 7, 6]
    whole = concat_chunks(ParallelCorpus, chunks)
    assert whole == source.read("train")
    assert whole.src == [r["doc"] for r in records]
    assert whole.references == [[r["s1"]] + ([f"t{i}"] if i % 3 else []) for i, r in enumerate(records)]
    assert all(c.references == [[t] + c.references[j][1:] for j, t in enumerate(c.tgt)] for c in chunks)
    with open(tmp_path / ("bad.jsonl"), "w") as f:
        f.write('{"doc": "a", "s1": "b"}\n\n{"doc": "a"}\n')
    with pytest.raises(SeqmixError, match=r"bad\.jsonl line 2 has none of the summary fields"):
        list(source.iter_chunks("bad", chunk_size=1))  # counted among non-blank lines, as before


# ---- generated, distilled -----------------------------------------------------------------------------------


def old_toy_read(toy: ToyReverseSource, split: str) -> ParallelCorpus:
    """ToyReverseSource.read before streaming, verbatim: the chunks must replay the same rng stream."""
    rng = np.random.default_rng([toy.seed, SPLITS.index(split)])
    src, tgt = [], []
    for _ in range(toy.sizes[split]):
        n = int(rng.integers(toy.min_len, toy.max_len + 1))
        words = [toy.words[j] for j in rng.integers(0, len(toy.words), size=n)]
        src.append(" ".join(words))
        tgt.append(" ".join(reversed(words)))
    return ParallelCorpus(src, tgt)


def test_toy_chunks_replay_the_same_stream():
    toy = ToyReverseSource(num_train=20, num_valid=0, num_test=45, vocab_size=30, seed=3)
    chunks = list(toy.iter_chunks("train", chunk_size=7))
    assert sizes(chunks) == [7, 7, 6]
    assert concat_chunks(ParallelCorpus, chunks) == toy.read("train") == old_toy_read(toy, "train")
    assert concat_chunks(ParallelCorpus, toy.iter_chunks("test", 44)) == old_toy_read(toy, "test")
    assert list(toy.iter_chunks("valid")) == [] and toy.read("valid") == ParallelCorpus([], [])
    assert toy.fingerprint("train") == toy.fingerprint("train") != toy.fingerprint("test")
    assert ToyReverseSource(num_train=20, seed=4).fingerprint("train") != toy.fingerprint("train")
    with pytest.raises(SeqmixError, match="splits"):
        next(toy.iter_chunks("val"))


def test_distilled_source_delegates_chunks(tmp_path):
    write(tmp_path / "train.en", ["a"] * 20), write(tmp_path / "train.de", ["b"] * 20)
    (tmp_path / "kd").mkdir()
    write(tmp_path / "kd" / "train.en", ["a"] * 20), write(tmp_path / "kd" / "train.de", ["teacher"] * 20)
    write(tmp_path / "val.en", ["v"] * 3), write(tmp_path / "val.de", ["V"] * 3)
    source = DistilledTrainSource("seqmix.data.LocalParallelSource", "en", "de", distilled_path=str(tmp_path / "kd"),
                                  path=str(tmp_path))
    chunks = list(source.iter_chunks("train", 7))
    assert sizes(chunks) == [7, 7, 6] and all(c.tgt == ["teacher"] * len(c) for c in chunks)
    assert concat_chunks(ParallelCorpus, source.iter_chunks("val", 2)) == source.read("val")


# ---- real data ----------------------------------------------------------------------------------------------


def test_multi30k_chunks(multi30k_dir):
    source = LocalParallelSource(str(multi30k_dir), "en", "de")
    chunks = list(source.iter_chunks("train", chunk_size=7_000))
    assert sizes(chunks) == [7_000] * 4 + [1_000]
    whole = concat_chunks(ParallelCorpus, chunks)
    assert whole == source.read("train")
    assert whole.src == reference_lines(multi30k_dir / "train.en.gz")
    assert whole.tgt == reference_lines(multi30k_dir / "train.de.gz")
    files = [multi30k_dir / f"train.{lang}.gz" for lang in ("en", "de")]
    assert source.fingerprint("train") == hashlib.sha256(
        b"en\0" + files[0].read_bytes() + b"de\0" + files[1].read_bytes()).hexdigest()


def test_wikitext2_chunks(shared_data):
    source = LocalTextSource(str(shared_data / "wikitext-2"))
    for split, n in (("train", 36_718), ("valid", 3_760)):
        chunks = list(source.iter_chunks(split, chunk_size=5_000))
        assert sizes(chunks) == [5_000] * (n // 5_000) + [n % 5_000]
        whole = concat_chunks(TextCorpus, chunks)
        assert whole == source.read(split)
        assert whole.lines == reference_lines(shared_data / "wikitext-2" / f"{split}.txt")


@pytest.mark.parametrize("name,fields,pattern,split,n", [
    ("dialogsum", ("dialogue", ["summary", "summary1", "summary2", "summary3"]), "dialogsum.{split}.jsonl",
     "train", 12_460),
    ("dialogsum", ("dialogue", ["summary", "summary1", "summary2", "summary3"]), "dialogsum.{split}.jsonl",
     "dev", 500),
    ("scitldr-a", ("source", ["target"]), "{split}.jsonl", "dev", 619),
    ("scitldr-a", ("source", ["target"]), "{split}.jsonl", "train", 1_992),
])
def test_summary_real_data_chunks(shared_data, name, fields, pattern, split, n):
    source = JsonlSummarySource(str(shared_data / name), *fields, pattern=pattern)
    chunks = list(source.iter_chunks(split, chunk_size=333))
    assert sizes(chunks) == [333] * (n // 333) + ([n % 333] if n % 333 else [])
    assert all(c.references is not None and [r[0] for r in c.references] == c.tgt for c in chunks)
    assert concat_chunks(ParallelCorpus, chunks) == source.read(split)


# ---- Hugging Face -------------------------------------------------------------------------------------------


def forbid_column_access(monkeypatch):
    """Make ``ds[<column name>]`` (which materializes a whole column in Python) fail."""
    import datasets

    original = datasets.Dataset.__getitem__

    def guarded(self, key):
        if isinstance(key, str):
            raise AssertionError(f"whole column {key!r} materialized")
        return original(self, key)

    monkeypatch.setattr(datasets.Dataset, "__getitem__", guarded)


N = 20


def hf_rows():
    src, tgt = pairs(N)
    return src, tgt, [{"en": s, "de": t} for s, t in zip(src, tgt)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One ``save_to_disk`` folder per record layout: ``{translation: {en, de}}`` and flat ``en``/``de``."""
    import datasets

    src, tgt, records = hf_rows()
    root = tmp_path_factory.mktemp("hf")
    layouts = {"nested": {"translation": records, "id": list(range(N))}, "flat": {"en": src, "de": tgt}}
    for layout, columns in layouts.items():
        datasets.DatasetDict({"train": datasets.Dataset.from_dict(columns)}).save_to_disk(str(root / layout))
    return root


def check_hf_chunks(source, monkeypatch, expected):
    source.available_splits()  # load first: only the reading is guarded
    forbid_column_access(monkeypatch)
    chunks = list(source.iter_chunks("train", chunk_size=7))
    assert sizes(chunks) == [7, 7, 6]
    assert concat_chunks(type(expected), chunks) == source.read("train") == expected
    source.fingerprint("train")
    monkeypatch.undo()


@pytest.mark.parametrize("layout", ["nested", "flat"])
def test_hf_saved_dataset_chunks(saved, monkeypatch, layout):
    src, tgt, _ = hf_rows()
    check_hf_chunks(HFParallelSource(None, "en", "de", load_from_disk=str(saved / layout)), monkeypatch,
                    ParallelCorpus(src, tgt))
    check_hf_chunks(HFParallelSource(None, "de", "en", load_from_disk=str(saved / layout)), monkeypatch,
                    ParallelCorpus(tgt, src))


@pytest.mark.parametrize("layout", ["nested", "flat"])
def test_hf_json_data_files_chunks(tmp_path, monkeypatch, layout):
    src, tgt, records = hf_rows()
    rows = [{"translation": r} for r in records] if layout == "nested" else records
    f = tmp_path / "train.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = HFParallelSource("json", "en", "de", data_files={"train": str(f)}, cache_dir=str(tmp_path / "c"))
    check_hf_chunks(source, monkeypatch, ParallelCorpus(src, tgt))


def test_hf_text_source_chunks(tmp_path, monkeypatch):
    import datasets

    lines = [f"line {i}\n" if i % 2 else f" {TRICKY[i % len(TRICKY)]} " for i in range(N)]
    datasets.Dataset.from_dict({"text": lines, "n": list(range(N))}).save_to_disk(str(tmp_path / "lm"))
    source = HFTextSource(None, load_from_disk=str(tmp_path / "lm"))
    check_hf_chunks(source, monkeypatch, TextCorpus([line.rstrip("\n") for line in lines]))
    with pytest.raises(SeqmixError, match=r"no 'body' column .*text_field"):
        next(HFTextSource(None, text_field="body", load_from_disk=str(tmp_path / "lm")).iter_chunks("train"))


def test_hf_errors_come_before_any_chunk(saved):
    for layout, match in (("nested", r"no language 'fr' under 'translation' \(found \['en', 'de'\]\)"),
                          ("flat", r"neither a 'translation' column nor a 'fr' column")):
        source = HFParallelSource(None, "en", "fr", load_from_disk=str(saved / layout))
        with pytest.raises(SeqmixError, match=match):
            next(source.iter_chunks("train", chunk_size=1))
        with pytest.raises(SeqmixError, match=match):
            source.fingerprint("train")


def test_hf_fingerprints(saved, tmp_path):
    nested = HFParallelSource(None, "en", "de", load_from_disk=str(saved / "nested"))
    flat = HFParallelSource(None, "en", "de", load_from_disk=str(saved / "flat"))
    key = nested.fingerprint("train")
    assert key == HFParallelSource(None, "en", "de", load_from_disk=str(saved / "nested")).fingerprint("train")
    assert key != flat.fingerprint("train")  # different datasets
    assert key != HFParallelSource(None, "de", "en", load_from_disk=str(saved / "nested")).fingerprint("train")
    own = nested._dataset("train")._fingerprint
    assert key == hashlib.sha256(json.dumps(["HFParallelSource", "translation", "en", "de", own]).encode()).hexdigest()
    # Without the dataset's own fingerprint: a hash of the text, equal for equal text in either layout.
    for source in (nested, flat):
        source._dataset("train")._fingerprint = None
    assert nested.fingerprint("train") == flat.fingerprint("train") != key
    # A changed data file changes the key (datasets hashes local data files' paths and modification times).
    f = tmp_path / "train.jsonl"
    f.write_text(json.dumps({"en": "a", "de": "b"}) + "\n")
    args = dict(data_files={"train": str(f)}, cache_dir=str(tmp_path / "c"))
    before = HFParallelSource("json", "en", "de", **args).fingerprint("train")
    f.write_text(json.dumps({"en": "a", "de": "changed"}) + "\n")
    os.utime(f, (f.stat().st_atime, f.stat().st_mtime + 10))
    assert HFParallelSource("json", "en", "de", **args).fingerprint("train") != before
