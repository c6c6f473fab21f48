"""``task.data.source.streaming=true``: a hub-layout dataset (``{"translation": {"de", "en"}}`` rows in json or
parquet data files, read by ``datasets``' own builders) is encoded straight from the stream. The stores must equal
the ones built from the Arrow copy, share their cache, leave no Arrow copy behind, and read every split once."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml

from seqmix.data import HFParallelSource, HFTextSource, TextCorpus, TranslationDataModule
from seqmix.data.sources import ParallelCorpus, concat_chunks
from seqmix.errors import SeqmixError

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before `datasets` is imported: never touch the network
os.environ["HF_HUB_OFFLINE"] = "1"

SPLIT_NAMES = {"train": "train", "valid": "validation", "test": "test"}
SIZES = {"train": 300, "validation": 40, "test": 30}
WORDS = ["Haus", "house", "über", "naïve", "Straße", "street", "l'été", "—", "42", "3.5", "«quoted»", "中文",
         "🙂"]


def pairs(split: str) -> tuple[list[str], list[str]]:
    """Deterministic sentence pairs of varied length with non-ASCII text, different per split."""
    rng = np.random.default_rng(list(SIZES).index(split))
    src, tgt = [], []
    for i in range(SIZES[split]):
        words = [WORDS[j] for j in rng.integers(0, len(WORDS), size=int(rng.integers(1, 25)))]
        src.append(f"{split} {i}: " + " ".join(words))
        tgt.append(f"{i} " + " ".join(reversed(words)))
    return src, tgt


def write_hub_layout(root, fmt: str) -> dict:
    """data_files for the hub's WMT layout; train is two files, so a chunk can straddle a file boundary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root.mkdir(parents=True, exist_ok=True)
    data_files = {}
    for split in SIZES:
        src, tgt = pairs(split)
        rows = [{"translation": {"de": t, "en": s}} for s, t in zip(src, tgt)]
        parts = [rows[:123], rows[123:]] if split == "train" else [rows]
        data_files[split] = []
        for k, part in enumerate(parts):
            path = root / f"{split}-{k}.{fmt}"
            if fmt == "json":
                path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part), encoding="utf-8")
            else:
                pq.write_table(pa.Table.from_pylist(part), path)
            data_files[split].append(str(path))
    return data_files


@pytest.fixture(scope="module", params=["json", "parquet"])
def hub(request, tmp_path_factory):
    fmt = request.param
    return fmt, write_hub_layout(tmp_path_factory.mktemp(f"hub-{fmt}") / "data", fmt)


def source(hub, hf_cache, streaming: bool, **kwargs) -> HFParallelSource:
    fmt, data_files = hub
    return HFParallelSource(fmt, "en", "de", data_files=data_files, cache_dir=str(hf_cache),
                            split_names=SPLIT_NAMES, streaming=streaming, **kwargs)


def module(src, cache_dir, chunk_size: int = 16) -> TranslationDataModule:
    return TranslationDataModule(src, "en", "de", {"train": "train", "valid": "valid", "test": "test"},
                                 {"vocab_size": 300, "min_frequency": 1}, cache_dir=str(cache_dir),
                                 chunk_size=chunk_size, verify_store=True)


def arrow_files(directory) -> list:
    return sorted(p.relative_to(directory) for p in directory.rglob("*.arrow")) if directory.exists() else []


def store_contents(store) -> dict:
    """Every file of a store, the header without the build's own clock readings."""
    files = {p.name: p.read_bytes() for p in sorted(store.path.iterdir()) if p.name != "header.json"}
    header = json.loads((store.path / "header.json").read_text())
    header.pop("created")
    header["meta"].pop("seconds")
    return {"files": files, "header": header, "name": store.path.name}


def test_streaming_source_reads_an_iterable_dataset_in_order(hub, tmp_path):
    """The real streaming path (an IterableDataset, no Arrow copy) gives every example in file order, in chunks
    smaller than the split that straddle the data files."""
    import datasets

    streamed = source(hub, tmp_path / "hf", streaming=True)
    ds = streamed._dataset("train")
    assert isinstance(ds, datasets.IterableDataset)
    chunks = list(streamed.iter_chunks("train", chunk_size=7))
    assert [len(c) for c in chunks] == [7] * 42 + [6]
    src, tgt = pairs("train")
    assert concat_chunks(ParallelCorpus, chunks) == ParallelCorpus(src, tgt)
    assert streamed.read("validation") == ParallelCorpus(*pairs("validation"))
    assert streamed.available_splits() == ["test", "train", "validation"]
    assert arrow_files(tmp_path / "hf") == []


def test_streamed_stores_equal_the_arrow_ones_and_share_their_cache(hub, tmp_path):
    """Same tokenizer, byte-identical stores under the same names; the streaming build writes no Arrow files
    (the non-streaming one does, so the check can fail), and a streaming run finds the stores built without it."""
    streaming = module(source(hub, tmp_path / "hf-stream", streaming=True), tmp_path / "seqmix-stream")
    tok_s, stores_s = streaming.prepare()
    assert all(streaming.built.values())
    assert arrow_files(tmp_path / "hf-stream") == []
    assert not [p for p in (tmp_path / "hf-stream").rglob("*") if p.is_file() and p.stat().st_size > 0]

    arrow = module(source(hub, tmp_path / "hf-arrow", streaming=False), tmp_path / "seqmix-arrow")
    tok_a, stores_a = arrow.prepare()
    assert arrow_files(tmp_path / "hf-arrow")  # the copy streaming avoids
    assert tok_s.to_json() == tok_a.to_json()
    assert set(stores_s) == set(stores_a) == {"train", "valid", "test"}
    for split in stores_s:
        assert store_contents(stores_s[split]) == store_contents(stores_a[split]), split
    assert len(stores_s["train"]) == SIZES["train"] and len(stores_s["test"]) == SIZES["test"]

    shared = module(source(hub, tmp_path / "hf-stream", streaming=True), tmp_path / "seqmix-arrow")
    shared.prepare()
    assert shared.built == {"train": False, "valid": False, "test": False}


def test_a_streaming_build_reads_each_split_once(hub, tmp_path, monkeypatch):
    """Train is streamed twice when the tokenizer is new (learn it, then encode), every other split once, and
    nothing at all once the stores exist: fingerprints come from the builder, not from the text."""
    reads = []
    batches = HFParallelSource._batches

    def counting(ds, columns, chunk_size):
        reads.append(ds.split)
        return batches(ds, columns, chunk_size)

    monkeypatch.setattr(HFParallelSource, "_batches", staticmethod(counting))
    build = module(source(hub, tmp_path / "hf", streaming=True), tmp_path / "seqmix", chunk_size=50)
    build.prepare()
    assert sorted(reads) == ["test", "train", "train", "validation"]
    reads.clear()
    module(source(hub, tmp_path / "hf", streaming=True), tmp_path / "seqmix").prepare()
    assert reads == []


def test_streaming_fingerprint_is_the_arrow_one(hub, tmp_path):
    """Streaming changes how the data is read, not what it is, so it is not part of the key; what is read is."""
    for split in SIZES:
        assert (source(hub, tmp_path / "a", streaming=True).fingerprint(split)
                == source(hub, tmp_path / "b", streaming=False).fingerprint(split))
    assert (source(hub, tmp_path / "a", streaming=True).fingerprint("train")
            != source(hub, tmp_path / "a", streaming=True).fingerprint("test"))
    reverse = HFParallelSource(hub[0], "de", "en", data_files=hub[1], cache_dir=str(tmp_path / "a"), streaming=True)
    assert reverse.fingerprint("train") != source(hub, tmp_path / "a", streaming=True).fingerprint("train")


def test_streaming_errors(hub, tmp_path):
    """A wrong language is named before any text is read, also when the builder declares no features; a saved
    folder cannot be streamed."""
    streamed = source(hub, tmp_path / "hf", streaming=True)
    streamed.src_lang = "fr"
    with pytest.raises(SeqmixError, match=r"no language 'fr' under 'translation'"):
        streamed.fingerprint("train")
    streamed._dataset("train")._info.features = None  # schema taken from the first row instead
    with pytest.raises(SeqmixError, match=r"no language 'fr' under 'translation' \(found \['de', 'en'\]\)"):
        next(streamed.iter_chunks("train"))
    streamed.src_lang = "en"
    assert next(streamed.iter_chunks("train", chunk_size=3)).src == pairs("train")[0][:3]
    with pytest.raises(SeqmixError, match="load_from_disk=null to stream"):
        HFParallelSource(None, "en", "de", load_from_disk=str(tmp_path), streaming=True)


def test_streaming_text_source(tmp_path):
    """The language-modeling source streams too (a ``text`` column, trailing newlines dropped)."""
    import datasets

    lines = [f"line {i} {WORDS[i % len(WORDS)]}\n" for i in range(25)]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines), encoding="utf-8")
    text = HFTextSource("json", data_files={"train": str(path)}, cache_dir=str(tmp_path / "hf"), streaming=True)
    assert isinstance(text._dataset("train"), datasets.IterableDataset)
    chunks = list(text.iter_chunks("train", chunk_size=10))
    assert [len(c) for c in chunks] == [10, 10, 5]
    assert concat_chunks(TextCorpus, chunks) == TextCorpus([line.rstrip("\n") for line in lines])
    assert arrow_files(tmp_path / "hf") == []


def test_every_hub_task_offers_streaming(repo_root):
    """Each shipped task read through ``datasets`` has the switch, off by default."""
    hub_tasks = []
    for path in sorted((repo_root / "conf" / "task").glob("*.yaml")):
        source_cfg = (yaml.safe_load(path.read_text()).get("data") or {}).get("source") or {}
        if source_cfg.get("_target_") in ("seqmix.data.HFParallelSource", "seqmix.data.HFTextSource"):
            hub_tasks.append(path.stem)
            assert source_cfg.get("streaming") is False, path.name
    assert {"wmt_ende", "wmt16_enro", "wmt_enfr", "lm1b", "cnndm"} <= set(hub_tasks)
