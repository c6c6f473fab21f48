"""Language-modeling data: local text and `datasets` sources, the word vocabulary, batches over a whole split."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
import torch

from seqmix.data import HFTextSource, LanguageModelingDataModule, LocalTextSource
from seqmix.data.tokenizer import Tokenizer, train_tokenizer
from seqmix.errors import SeqmixError

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before `datasets` is imported: never touch the network

TEXT = [" = Title = ", "", " the cat sat on the mat . ", " the <unk> sat . ", "", " a dog ran on the mat . "]


def write_splits(directory, **splits):
    directory.mkdir(exist_ok=True)
    for name, text in splits.items():
        (directory / f"{name}.txt").write_text("".join(line + "\n" for line in text), encoding="utf-8")
    return directory


def module(source, tmp_path, **kw):
    args = {"splits": {"train": "train", "valid": "valid"}, "tokenizer": {"kind": "word"}, "tokens_per_sample": 4,
            "max_tokens": 16, "cache_dir": str(tmp_path / "cache"), **kw}
    return LanguageModelingDataModule(source, **args)


def test_word_vocabulary_is_sorted_by_frequency_and_unk_is_the_special():
    tok = train_tokenizer(TEXT, vocab_size=100, kind="word", min_frequency=1)
    words = [tok._hf.id_to_token(i) for i in range(4, tok.vocab_size)]
    counts = Counter(w for line in TEXT for w in line.split() if w != "<unk>")
    assert words[:2] == ["the", "."] and [counts[w] for w in words] == sorted(counts.values(), reverse=True)
    assert tok.encode(" the <unk> zebra ") == [tok.encode("the")[0], Tokenizer.unk, Tokenizer.unk]
    assert tok.decode(tok.encode(" the  cat  sat ")) == "the cat sat"
    again = Tokenizer.from_json(tok.to_json())
    assert again.kind == "word" and again.encode("a dog") == tok.encode("a dog")
    small = train_tokenizer(TEXT, vocab_size=6, kind="word", min_frequency=1)
    assert small.vocab_size == 6 and small.encode("cat") == [Tokenizer.unk]


def test_one_epoch_predicts_every_token_once(tmp_path):
    data = write_splits(tmp_path / "d", train=TEXT * 3, valid=TEXT)
    dm = module(LocalTextSource(str(data)), tmp_path)
    dm.setup()
    tok = dm.tokenizer
    expect = [t for line in TEXT * 3 for t in [*tok.encode(line), tok.eos]]
    seen = []
    for batch in dm.dataloader("train", shuffle=True):
        assert batch["tokens"].numel() <= 16
        seen += batch["target"][batch["target"].ne(tok.pad)].tolist()
    assert Counter(seen) == Counter(expect) and len(seen) == len(expect)
    ids = [i for b in dm.dataloader("valid") for i in b["id"].tolist()]
    assert sorted(ids) == list(range(len(dm.datasets["valid"])))


def test_wikitext2_token_counts_match_the_official_ones(shared_data, tmp_path):
    """README of the data: 2,088,628 / 217,646 tokens with one </s> per line; 33,277 types (incl. <unk>)."""
    dm = module(LocalTextSource(str(shared_data / "wikitext-2")), tmp_path, tokens_per_sample=512, max_tokens=4096)
    dm.setup()
    assert dm.datasets["train"].num_targets == 2_088_628
    assert dm.datasets["valid"].num_targets == 217_646
    assert dm.tokenizer.vocab_size == 33_277 + 3  # + <s> <pad> </s>
    stream = np.asarray(dm.datasets["train"].stream)
    assert (stream == dm.tokenizer.unk).sum() > 0 and (stream == dm.tokenizer.eos).sum() == 36_718 + 1


def test_hf_text_source_reads_local_datasets_files(tmp_path):
    path = tmp_path / "wiki.jsonl"
    path.write_text("".join(f'{{"text": "{line}\\n"}}\n' for line in TEXT), encoding="utf-8")
    source = HFTextSource("json", data_files={"train": str(path), "validation": str(path)},
                          split_names={"valid": "validation"}, cache_dir=str(tmp_path / "hf"))
    assert source.read("valid").lines == TEXT
    dm = module(source, tmp_path)
    dm.setup()
    assert dm.datasets["valid"].num_targets == sum(len(line.split()) + 1 for line in TEXT)
    with pytest.raises(SeqmixError, match="text_field"):
        HFTextSource("json", text_field="body", data_files={"train": str(path)},
                     cache_dir=str(tmp_path / "hf")).read("train")


def test_settings_errors_are_clear(tmp_path):
    with pytest.raises(SeqmixError, match="max_target_positions"):
        module(LocalTextSource(str(tmp_path)), tmp_path, tokens_per_sample=600, eval_context=600, max_positions=1024)
    with pytest.raises(SeqmixError, match="break_mode=none"):
        module(LocalTextSource(str(tmp_path)), tmp_path, break_mode="eos", eval_context=8)
    with pytest.raises(SeqmixError, match="does not exist"):
        module(LocalTextSource(str(tmp_path / "nowhere")), tmp_path).setup()
    with pytest.raises(SeqmixError, match="kind"):
        module(LocalTextSource(str(write_splits(tmp_path / "e", train=TEXT, valid=TEXT))), tmp_path,
               tokenizer={"kind": "chars"}).setup()


def test_encoded_splits_are_stored_once(tmp_path, monkeypatch):
    data = write_splits(tmp_path / "d", train=TEXT, valid=TEXT)
    first = module(LocalTextSource(str(data)), tmp_path)
    first.setup()
    stores = sorted((tmp_path / "cache").rglob("*.store"))
    assert [p.name.split("-")[0] for p in stores] == ["train", "valid"]

    def boom(*a, **k):
        raise AssertionError("the store should have been read, not rebuilt")

    monkeypatch.setattr(Tokenizer, "encode_flat", boom)
    second = module(LocalTextSource(str(data)), tmp_path)
    second.setup()
    assert np.array_equal(first.datasets["train"].stream, second.datasets["train"].stream)


@pytest.mark.parametrize("split,shuffle", [("train", True), ("valid", False)])
def test_ranks_see_distinct_blocks_that_cover_the_split(tmp_path, split, shuffle):
    """Two DDP ranks (simulated): equal batch counts, no block on both ranks except whole repeated batches
    (padding for equal counts), and together every block, so every token, exactly once."""
    from types import SimpleNamespace

    data = write_splits(tmp_path / "d", train=TEXT * 7, valid=TEXT * 5)
    dm = module(LocalTextSource(str(data)), tmp_path, tokens_per_sample=3, eval_context=2, max_tokens=12)
    dm.setup()
    ds = dm.datasets[split]
    per_rank = []
    try:
        for rank in (0, 1):
            dm.trainer = SimpleNamespace(global_rank=rank, world_size=2)
            per_rank.append([tuple(b["id"].tolist()) for b in dm.dataloader(split, shuffle=shuffle)])
    finally:
        dm.trainer = None
    assert len(per_rank[0]) == len(per_rank[1]) > 1
    shared = set(per_rank[0]) & set(per_rank[1])
    assert len(shared) <= 1  # at most the one batch repeated to even out the counts
    distinct = set(per_rank[0]) | set(per_rank[1])
    ids = sorted(i for batch in distinct for i in batch)
    assert ids == list(range(len(ds)))
    tokens = torch.cat([ds[i]["target"][ds[i]["target"].ne(dm.tokenizer.pad)] for i in ids])
    assert torch.equal(tokens, torch.from_numpy(np.asarray(ds.stream[1:], dtype=np.int64)))
