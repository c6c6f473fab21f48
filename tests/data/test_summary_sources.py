"""Summarization data: DialogSum / SciTLDR JSON lines (their different records), `datasets` files, truncation."""

from __future__ import annotations

import json
import os

import pytest

from seqmix.data import HFParallelSource, JsonlSummarySource, TranslationDataModule
from seqmix.errors import SeqmixError

os.environ["HF_DATASETS_OFFLINE"] = "1"  # before `datasets` is imported: never touch the network

DIALOGSUM_FIELDS = ["summary", "summary1", "summary2", "summary3"]


def dialogsum(shared_data):
    return JsonlSummarySource(str(shared_data / "dialogsum"), "dialogue", DIALOGSUM_FIELDS,
                              pattern="dialogsum.{split}.jsonl")


def test_dialogsum_train_is_python_literals_and_dev_is_json(shared_data):
    source = dialogsum(shared_data)
    train, dev = source.read("train"), source.read("dev")
    assert (len(train), len(dev)) == (12_460, 500)
    assert train.src[0].startswith("#Person1#: Hi, Mr. Smith. I'm Doctor Hawkins.") and "\n#Person2#" in train.src[0]
    assert dev.tgt[0].startswith("#Person2# has trouble breathing.")
    assert dev.reference_sets()[0] == [dev.tgt[0]]


def test_dialogsum_test_layout_gives_three_references(tmp_path):
    record = {"fname": "test_0", "dialogue": "#Person1#: Hi.", "summary1": "A.", "topic1": "t", "summary2": "B.",
              "topic2": "t", "summary3": "C.", "topic3": "t"}
    (tmp_path / "dialogsum.test.jsonl").write_text(json.dumps(record))  # no final newline, as the release
    corpus = JsonlSummarySource(str(tmp_path), "dialogue", DIALOGSUM_FIELDS, "dialogsum.{split}.jsonl").read("test")
    assert corpus.tgt == ["A."] and corpus.reference_sets() == [["A.", "B.", "C."]]


def test_scitldr_joins_source_sentences_and_keeps_every_tldr(shared_data):
    source = JsonlSummarySource(str(shared_data / "scitldr-a"), "source", ["target"])
    dev = source.read("dev")
    assert len(dev) == 619
    raw = json.loads((shared_data / "scitldr-a" / "dev.jsonl").read_text().split("\n", 1)[0])
    assert dev.src[0] == " ".join(raw["source"])
    assert dev.reference_sets()[0] == raw["target"] and dev.tgt[0] == raw["target"][0]
    counts = [len(r) for r in dev.reference_sets()]
    assert min(counts) == 1 and max(counts) == 4
    assert all(len(r) == 1 for r in source.read("train").reference_sets())


def test_bad_records_name_the_line_and_the_setting(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"document": "d", "summary": "s"}\n{"document": "e"}\n')
    with pytest.raises(SeqmixError, match=r"line 2 .*target_fields"):
        JsonlSummarySource(str(tmp_path), "document", ["summary"]).read("train")
    with pytest.raises(SeqmixError, match="source_field"):
        JsonlSummarySource(str(tmp_path), "article", ["summary"]).read("train")
    (tmp_path / "valid.jsonl").write_text("not a record\n")
    with pytest.raises(SeqmixError, match="valid.jsonl line 1 is neither JSON"):
        JsonlSummarySource(str(tmp_path), "document", ["summary"]).read("valid")
    with pytest.raises(SeqmixError, match="test.jsonl"):
        JsonlSummarySource(str(tmp_path), "document", ["summary"]).read("test")


def test_xsum_records_through_datasets(shared_data, tmp_path):
    """The transformers XSum fixture (document/summary records) read by the `datasets` json builder."""
    sample = str(shared_data / "hf-transformers-samples" / "xsum" / "sample.json")
    source = HFParallelSource("json", "document", "summary", data_files={"train": sample, "validation": sample},
                              split_names={"valid": "validation"}, cache_dir=str(tmp_path / "hf"))
    corpus = source.read("valid")
    first = json.loads(open(sample, encoding="utf-8").readline())
    assert len(corpus) == 10 and corpus.src[0] == first["document"] and corpus.tgt[0] == first["summary"]


def test_summarization_module_truncates_documents_and_keeps_references(shared_data, tmp_path):
    args = dict(src_lang="abstract", tgt_lang="tldr", splits={"train": "train", "valid": "dev"},
                tokenizer={"vocab_size": 2000}, max_source_positions=1024, max_target_positions=1024,
                cache_dir=str(tmp_path))
    source = JsonlSummarySource(str(shared_data / "scitldr-a"), "source", ["target"])
    dm = TranslationDataModule(source, truncate_source=50, **args)
    dm.setup()
    whole = TranslationDataModule(source, **args)
    whole.setup()
    cut, full = dm.datasets["valid"], whole.datasets["valid"]
    sources = [cut[i]["source"][:-1].tolist() for i in range(len(cut))]  # without the eos
    assert max(map(len, sources)) == 50 and max(full.src.sizes) > 50
    assert all(a == full[i]["source"][:-1].tolist()[:50] for i, a in enumerate(sources))
    assert cut.src_sizes.tolist() == [len(a) + 1 for a in sources]
    refs = dm.reference_sets("valid")
    assert len(refs) == 619 and max(map(len, refs)) == 4
    assert refs[0] == [dm.tokenizer.normalize_reference(r) for r in source.read("dev").reference_sets()[0]]
    with pytest.raises(SeqmixError, match="truncate_source"):
        TranslationDataModule(source, truncate_source=1024, **args)
