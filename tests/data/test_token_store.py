"""Token stores: exact round trips, safe building (atomic, locked, killed midway) and refusing damaged stores."""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import Tokenizer as HFTokenizer

from seqmix.data import (
    LanguageModelingDataModule,
    LocalTextSource,
    TranslationDataModule,
)
from seqmix.data.ragged import Ragged
from seqmix.data.sources import LocalParallelSource
from seqmix.data.summary_sources import JsonlSummarySource
from seqmix.data.token_store import (
    StoreInvalid,
    StoreMissing,
    StoreWriter,
    open_or_build,
    open_store,
    token_dtype,
)
from seqmix.errors import SeqmixError
from tests.conftest import PYTHON, ROOT

MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": None}


def direct_ids(tokenizer, texts) -> list[list[int]]:
    """Each text encoded alone by a `tokenizers` object rebuilt from the saved JSON (not seqmix's batch path)."""
    hf = HFTokenizer.from_str(json.dumps(json.loads(tokenizer.to_json())["hf"]))
    hf.encode_special_tokens = True
    return [hf.encode(t, add_special_tokens=False).ids for t in texts]


def write_rows(path: Path, rows: list[list[int]], vocab_size: int, texts: list[str] | None = None) -> Path:
    with StoreWriter(path, "hash", vocab_size) as w:
        w.add_field("ids")
        if texts is not None:
            w.add_field("text", "text")
        for start in range(0, len(rows), 3):  # several appends, as chunks arrive
            part = rows[start: start + 3]
            sizes = np.array([len(r) for r in part], dtype=np.int64)
            w.append("ids", np.array([t for r in part for t in r], dtype=np.int64), sizes)
            if texts is not None:
                w.append_texts("text", texts[start: start + 3])
        w.commit({"note": "x"})
    return path


# ---- the store format ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab_size", [8000, 65536, 300_000])
def test_rows_round_trip_in_the_compact_dtype(tmp_path, vocab_size):
    rng = np.random.default_rng(vocab_size)
    rows = [rng.integers(0, vocab_size, size=int(rng.integers(0, 40))).tolist() for _ in range(50)] + [[]]
    texts = [f"línea {i} \u00a0·\u2028 x" for i in range(len(rows))]
    store = open_store(write_rows(tmp_path / "s.store", rows, vocab_size, texts), "hash")
    ids = store.tokens("ids")
    assert ids.flat.dtype == token_dtype(vocab_size) == (np.uint16 if vocab_size <= 65536 else np.int32)
    assert ids.tolist() == rows and ids.sizes.tolist() == [len(r) for r in rows]
    assert list(store.texts("text")) == texts and len(store) == len(rows) and store.meta["note"] == "x"
    assert isinstance(ids.flat, np.memmap)  # mapped, not read into memory


def test_a_mapped_field_pickles_as_its_file_names(tmp_path):
    rows = [[i] * 100 for i in range(2000)]
    ids = open_store(write_rows(tmp_path / "s.store", rows, 8000)).tokens("ids")
    blob = pickle.dumps(ids)
    assert len(blob) < 2000 < ids.flat.nbytes  # what a DataLoader worker receives: paths, not 400 KB of data
    again = pickle.loads(blob)
    assert isinstance(again.flat, np.memmap) and again.tolist() == rows
    small = Ragged.from_rows([[1, 2], [3]])
    assert pickle.loads(pickle.dumps(small)).tolist() == [[1, 2], [3]]  # in-memory rows pickle as data


def test_a_failed_build_leaves_nothing(tmp_path):
    path = tmp_path / "s.store"

    def build(writer):
        writer.add_field("ids")
        writer.append("ids", np.arange(5), np.array([5]))
        raise SeqmixError("the source broke midway")

    with pytest.raises(SeqmixError, match="midway"):
        open_or_build(path, "h", 100, build)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.store.lock"]  # no store, no temporary directory
    with pytest.raises(StoreMissing):
        open_store(path)


def test_a_full_disk_ends_in_one_clear_error(tmp_path):
    def build(writer):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(SeqmixError, match="free disk space or set task.data.cache_dir"):
        open_or_build(tmp_path / "s.store", "h", 100, build)
    assert not (tmp_path / "s.store").exists()


def test_ids_outside_the_vocabulary_are_refused_at_writing(tmp_path):
    with pytest.raises(ValueError, match="outside the vocabulary"), StoreWriter(tmp_path / "s.store", "h", 10) as w:
        w.add_field("ids")
        w.append("ids", np.array([3, 10]), np.array([2]))
    assert not (tmp_path / "s.store").exists()


def corrupt_cut(path: Path) -> None:
    f = path / "ids.values.bin"
    f.write_bytes(f.read_bytes()[:-3])


def corrupt_flip(path: Path) -> None:
    f = path / "ids.values.bin"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x40
    f.write_bytes(bytes(data))


def corrupt_offsets(path: Path) -> None:
    f = path / "ids.offsets.bin"
    data = bytearray(f.read_bytes())
    data[8] ^= 0x01
    f.write_bytes(bytes(data))


def corrupt_header(path: Path) -> None:
    (path / "header.json").write_text('{"format": "seqmix-token-store", "vers')


def drop_file(path: Path) -> None:
    (path / "ids.sizes.bin").unlink()


@pytest.mark.parametrize("damage,message", [
    (corrupt_cut, "bytes, the header says"), (corrupt_flip, "checksum"), (corrupt_offsets, "checksum"),
    (corrupt_header, "unreadable header"), (drop_file, "missing"),
])
def test_damaged_stores_are_refused(tmp_path, damage, message):
    rows = [list(range(i, i + 7)) for i in range(40)]
    path = write_rows(tmp_path / "s.store", rows, 8000)
    damage(path)
    with pytest.raises(StoreInvalid, match=message):
        open_store(path, "hash")


def test_another_vocabulary_or_format_is_refused(tmp_path):
    path = write_rows(tmp_path / "s.store", [[1, 2, 3]], 8000)
    with pytest.raises(StoreInvalid, match="another vocabulary"):
        open_store(path, "other-hash")
    header = json.loads((path / "header.json").read_text())
    (path / "header.json").write_text(json.dumps({**header, "version": 99}))
    with pytest.raises(StoreInvalid, match="version 99"):
        open_store(path)


def test_a_size_check_alone_still_catches_cut_files(tmp_path):
    path = write_rows(tmp_path / "s.store", [[1, 2, 3]] * 10, 8000)
    corrupt_cut(path)
    with pytest.raises(StoreInvalid, match="bytes"):
        open_store(path, verify=False)


# ---- exact round trips on the real data ------------------------------------------------------------------------

def translation_module(source, src_lang, tgt_lang, splits, cache, **kw):
    return TranslationDataModule(source, src_lang, tgt_lang, splits, {"vocab_size": 4000}, max_tokens=4096,
                                 cache_dir=str(cache), **kw)


def test_multi30k_stores_equal_direct_encoding(multi30k_dir, tmp_path):
    dm = translation_module(LocalParallelSource(str(multi30k_dir), "en", "de"), "en", "de", MULTI30K_SPLITS,
                            tmp_path)
    dm.setup()
    source = LocalParallelSource(str(multi30k_dir), "en", "de")
    for split, name in (("train", "train"), ("valid", "val")):
        corpus, store = source.read(name), dm.stores[split]
        assert store.tokens("src").tolist() == direct_ids(dm.tokenizer, corpus.src), split
        assert store.tokens("tgt").tolist() == direct_ids(dm.tokenizer, corpus.tgt), split
        assert store.tokens("src").flat.dtype == np.uint16
    valid = dm.datasets["valid"]
    assert list(valid.src_texts) == source.read("val").src and list(valid.references) == [[t] for t in
                                                                                          source.read("val").tgt]
    assert not dm.stores["train"].has("src_text")  # raw text is kept for scored splits only
    with pytest.raises(ValueError, match="only scored splits"):
        len(dm.datasets["train"].src_texts)


def test_wikitext2_stream_equals_direct_encoding(shared_data, tmp_path):
    dm = LanguageModelingDataModule(LocalTextSource(str(shared_data / "wikitext-2")), {"train": "train", "valid": "valid"},
                                    {"kind": "word"}, tokens_per_sample=512, cache_dir=str(tmp_path))
    dm.setup()
    for split in ("train", "valid"):
        lines = LocalTextSource(str(shared_data / "wikitext-2")).read(split).lines
        stream = dm.stores[split].tokens("stream")
        eos = dm.tokenizer.eos
        assert [row[:-1] for row in stream.tolist()] == direct_ids(dm.tokenizer, lines), split
        assert all(row[-1] == eos for row in stream.tolist()) and int(stream.flat[0]) == eos
        assert np.array_equal(dm.datasets[split].stream, stream.flat)  # samples slice the map itself
        assert stream.flat.dtype == np.uint16 and isinstance(stream.flat, np.memmap)


def test_dialogsum_stores_equal_direct_encoding(shared_data, tmp_path):
    source = JsonlSummarySource(str(shared_data / "dialogsum"), "dialogue", ["summary", "summary1"],
                                "dialogsum.{split}.jsonl")
    dm = TranslationDataModule(source, "dialogue", "summary", {"train": "train", "valid": "dev"},
                                 {"vocab_size": 4000}, truncate_source=400, cache_dir=str(tmp_path))
    dm.setup()
    for split, name in (("train", "train"), ("valid", "dev")):
        corpus = source.read(name)
        assert dm.stores[split].tokens("src").tolist() == direct_ids(dm.tokenizer, corpus.src), split
        assert dm.stores[split].tokens("tgt").tolist() == direct_ids(dm.tokenizer, corpus.tgt), split
    ds = dm.datasets["valid"]
    assert ds[3]["source"][:-1].tolist() == direct_ids(dm.tokenizer, [source.read("dev").src[3]])[0][:400]
    assert list(ds.references) == source.read("dev").reference_sets()


# ---- batching on the store -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def multi30k_store(multi30k_dir, tmp_path_factory):
    dm = translation_module(LocalParallelSource(str(multi30k_dir), "en", "de"), "en", "de", MULTI30K_SPLITS,
                            tmp_path_factory.mktemp("store"), max_source_positions=40, max_target_positions=40)
    dm.setup()
    return dm


@pytest.mark.parametrize("split,shuffle", [("train", True), ("valid", False)])
def test_batches_cover_kept_pairs_once_within_budget_on_disjoint_ranks(multi30k_store, split, shuffle):
    dm = multi30k_store
    ds = dm.datasets[split]
    assert dm.num_skipped[split] > 0 and len(ds) + dm.num_skipped[split] == len(dm.stores[split])
    per_rank = []
    try:
        for rank in (0, 1):
            dm.trainer = SimpleNamespace(global_rank=rank, world_size=2, current_epoch=3)
            sampler = dm.dataloader(split, shuffle=shuffle).batch_sampler
            sampler.set_epoch(3)
            per_rank.append([tuple(b) for b in sampler])
    finally:
        dm.trainer = None
    assert len(per_rank[0]) == len(per_rank[1])
    assert len(set(per_rank[0]) & set(per_rank[1])) <= 1  # at most the batch repeated to even the counts
    counts = Counter(i for batch in set(per_rank[0]) | set(per_rank[1]) for i in batch)
    assert sorted(counts) == list(range(len(ds))) and set(counts.values()) == {1}
    for batch in per_rank[0] + per_rank[1]:
        longest = max(max(ds.src_sizes[list(batch)]), max(ds.tgt_sizes[list(batch)]))
        assert len(batch) * longest <= dm.max_tokens
        assert all(len(ds[i]["source"]) <= 40 and len(ds[i]["target"]) <= 40 for i in batch[:3])


def test_loader_workers_share_the_map_and_give_the_same_batches(multi30k_store):
    dm = multi30k_store
    ds = dm.datasets["train"]
    arrays = ds.src_sizes.nbytes + ds.tgt_sizes.nbytes + ds.index.nbytes  # the per-example sizes and kept rows
    assert len(pickle.dumps(ds)) < arrays + 5_000 < arrays + ds.src.flat.nbytes  # the token data goes by file name
    dm.num_workers = 2
    try:
        with_workers = [b["id"].tolist() for _, b in zip(range(5), dm.train_dataloader())]
        targets = [b["target"] for _, b in zip(range(5), dm.train_dataloader())]
    finally:
        dm.num_workers = 0
    plain = list(zip(range(5), dm.train_dataloader()))
    assert with_workers == [b["id"].tolist() for _, b in plain]
    assert all((t == b["target"]).all() for t, (_, b) in zip(targets, plain))


# ---- rebuilding, killed builds, concurrent builds ----------------------------------------------------------------

@pytest.mark.parametrize("damage", [corrupt_flip, corrupt_cut, "vocabulary"])
def test_a_damaged_cached_store_is_rebuilt_not_read(multi30k_dir, tmp_path, caplog, damage):
    source = LocalParallelSource(str(multi30k_dir), "en", "de")
    splits = {"train": "val"}  # small: the real valid split as a training set
    first = translation_module(source, "en", "de", splits, tmp_path)
    first.setup()
    expected = first.stores["train"].tokens("src").tolist()
    path = first.stores["train"].path
    if damage == "vocabulary":
        header = json.loads((path / "header.json").read_text())
        (path / "header.json").write_text(json.dumps({**header, "vocab_hash": "0" * 64}))
    else:
        target = path / "src.values.bin"
        data = bytearray(target.read_bytes())
        if damage is corrupt_cut:
            data = data[:-2]
        else:
            data[len(data) // 3] ^= 0x10
        target.write_bytes(bytes(data))
    again = translation_module(source, "en", "de", splits, tmp_path)
    with caplog.at_level(logging.WARNING):
        again.setup()
    assert "unusable" in caplog.text and "rebuilding" in caplog.text
    assert again.built["train"] and again.stores["train"].tokens("src").tolist() == expected
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # nothing left aside


SLOW_BUILD = """
import sys, time
from seqmix.data import TranslationDataModule
from seqmix.data.sources import ParallelCorpus

class SlowSource:
    def fingerprint(self, split):
        return "slow-" + split
    def iter_chunks(self, split, chunk_size):
        for i in range(int(sys.argv[2])):
            yield ParallelCorpus([f"a b c {i} {j}" for j in range(50)], [f"x y {j} {i}" for j in range(50)])
            time.sleep(float(sys.argv[3]))

dm = TranslationDataModule(SlowSource(), "a", "x", {"train": "train"}, {"vocab_size": 60, "min_frequency": 1},
                           cache_dir=sys.argv[1])
dm.setup()
print("BUILT" if dm.built["train"] else "FOUND", len(dm.datasets["train"]), flush=True)
"""


def run_build(cache: Path, chunks: int, pause: float) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "-c", SLOW_BUILD, str(cache), str(chunks), str(pause)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_build_killed_midway_is_never_taken_for_a_store(tmp_path):
    proc = run_build(tmp_path, 400, 0.02)
    deadline = time.time() + 120
    while not any(p.stat().st_size > 0 for p in tmp_path.rglob(".train-*.tmp/src.values.bin")):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not list(tmp_path.rglob("*.store"))  # only the hidden temporary directory is left
    store_dir = next(tmp_path.rglob(".train-*.tmp")).parent
    again = run_build(tmp_path, 4, 0.0)
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err
    assert out.split() == ["BUILT", "200"]  # a fresh, complete build, not the killed one's files
    assert [p.name for p in store_dir.iterdir() if p.name.startswith(".")] == []  # the stale build was removed


@pytest.mark.slow
def test_two_processes_building_at_once_end_with_one_valid_store(tmp_path):
    procs = [run_build(tmp_path, 30, 0.02) for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    verdicts = sorted(out.split()[0] for out, _ in results)
    assert verdicts == ["BUILT", "FOUND"]  # one encoded it; the other waited and read it
    assert all(out.split()[1] == "1500" for out, _ in results)
    stores = list(tmp_path.rglob("*.store"))
    assert len(stores) == 1 and len(open_store(stores[0])) == 1500
    assert not list(tmp_path.rglob(".*.tmp"))


def test_stores_are_found_through_their_source(tmp_path):
    """A store is a cache keyed by its source's content: with the source gone, the source's own error says so."""
    data = tmp_path / "data"
    data.mkdir()
    for lang, lines in (("en", ["a b", "c d"]), ("de", ["x y", "z w"])):
        (data / f"train.{lang}").write_text("\n".join(lines) + "\n")
    first = translation_module(LocalParallelSource(str(data), "en", "de"), "en", "de", {"train": "train"},
                               tmp_path / "cache")
    first.setup()
    (data / "train.de").write_text("x y\nz w v\n")  # a changed corpus gets a new store, never the old one
    changed = translation_module(LocalParallelSource(str(data), "en", "de"), "en", "de", {"train": "train"},
                                 tmp_path / "cache")
    changed.setup()
    assert changed.built["train"] and changed.stores["train"].path != first.stores["train"].path
    for f in data.iterdir():
        f.unlink()
    with pytest.raises(SeqmixError, match="needs train.en"):
        translation_module(LocalParallelSource(str(data), "en", "de"), "en", "de", {"train": "train"},
                           tmp_path / "cache").setup()
