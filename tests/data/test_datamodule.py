import logging
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from seqmix.data import translation_datamodule as dm_module
from seqmix.data.dataset import PairDataset, collate_pairs
from seqmix.data.sources import LocalParallelSource, ParallelCorpus, ToyReverseSource
from seqmix.data.tokenizer import Tokenizer
from seqmix.data.translation_datamodule import TranslationDataModule
from seqmix.errors import SeqmixError

SPLITS = {"train": "train", "valid": "val", "test": None}
POSITIONS = 40  # small enough that some Multi30k pairs get skipped


@pytest.fixture(scope="module")
def data_dir(multi30k_dir):
    return multi30k_dir


def multi30k_dm(data_dir, cache_dir, **kw):
    # short positions on purpose (1.6% of the training pairs skipped): the skipping itself is tested here
    args = {"max_tokens": 2048, "max_source_positions": POSITIONS, "max_target_positions": POSITIONS,
            "max_skipped_fraction": 1.0, **kw}
    return TranslationDataModule(LocalParallelSource(str(data_dir), "en", "de"), "en", "de", SPLITS,
                                 {"vocab_size": 2000}, cache_dir=str(cache_dir), **args)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("seqmix_cache")


@pytest.fixture(scope="module")
def dm(data_dir, cache_dir):
    module = multi30k_dm(data_dir, cache_dir)
    module.setup("fit")
    return module


def test_setup_builds_filtered_splits(dm):
    assert set(dm.datasets) == {"train", "valid"} and dm.tokenizer.vocab_size == 2000
    assert dm.num_skipped["train"] > 0
    assert len(dm.datasets["train"]) + dm.num_skipped["train"] == 29000
    assert len(dm.datasets["valid"]) + dm.num_skipped["valid"] == 1014
    for ds in dm.datasets.values():
        assert (ds.src_sizes <= POSITIONS).all() and (ds.tgt_sizes <= POSITIONS).all()
    item = dm.datasets["train"][0]
    assert item["source"][-1] == dm.tokenizer.eos and item["target"][-1] == dm.tokenizer.eos
    assert len(item["source"]) == dm.datasets["train"].src_sizes[0]


def test_references_align_with_dataset(dm):
    refs, ds = dm.references("valid"), dm.datasets["valid"]
    assert len(refs) == len(ds)
    assert refs == [dm.tokenizer.normalize_reference(t) for t in ds.tgt_texts]
    # Reference i is the text that pair i encodes, so hypotheses can be matched through batch["id"].
    assert all(dm.tokenizer.decode(ds[i]["target"]) == refs[i] for i in range(0, len(ds), 50))


def test_train_batches_shift_and_count(dm):
    tok = dm.tokenizer
    loader = dm.train_dataloader()
    batch = next(iter(loader))
    b, t = batch["target"].shape
    assert batch["prev_output_tokens"].shape == (b, t) and batch["src_tokens"].shape[0] == b == batch["nsentences"]
    assert b * max(t, batch["src_tokens"].shape[1]) <= 2048
    lengths = (batch["target"] != tok.pad).sum(1)
    assert batch["ntokens"] == int(lengths.sum())
    assert (batch["prev_output_tokens"][:, 0] == tok.bos).all()
    for row, n in enumerate(lengths.tolist()):
        assert batch["target"][row, n - 1] == tok.eos
        assert torch.equal(batch["prev_output_tokens"][row, 1:n], batch["target"][row, : n - 1])
        assert (batch["prev_output_tokens"][row, n:] == tok.pad).all()
        assert torch.equal(batch["target"][row, :n], dm.datasets["train"][int(batch["id"][row])]["target"])
    assert torch.equal(batch["src_lengths"], (batch["src_tokens"] != tok.pad).sum(1))


def test_val_loader_sees_every_pair_once(dm):
    ids = Counter(i for batch in dm.val_dataloader() for i in batch["id"].tolist())
    assert sorted(ids) == list(range(len(dm.datasets["valid"]))) and set(ids.values()) == {1}
    with pytest.raises(SeqmixError, match=r"task\.data\.splits\.test"):
        dm.test_dataloader()


def test_setup_is_idempotent_and_second_setup_uses_cache(dm, data_dir, cache_dir, monkeypatch):
    tok, datasets = dm.tokenizer, dm.datasets
    dm.setup("validate")
    assert dm.tokenizer is tok and dm.datasets is datasets

    def boom(*a, **k):
        raise AssertionError("cache miss: this should not run")

    monkeypatch.setattr("seqmix.data.tokenizer.train_tokenizer", boom)
    monkeypatch.setattr(Tokenizer, "encode_flat", boom)
    again = multi30k_dm(data_dir, cache_dir)
    again.setup("fit")  # tokenizer-only callers can stop here
    assert again.tokenizer.to_json() == tok.to_json()
    assert again.datasets["train"].src.tolist() == datasets["train"].src.tolist()
    assert again.references("valid") == dm.references("valid")


def test_rank_comes_from_trainer(dm):
    """Under DDP every rank gets the same number of eval batches (collectives stay in step); the batches
    beyond the real ones repeat earlier batches whole, so the task can drop them by their ids."""
    per_rank = []
    try:
        for rank in (0, 1):
            dm.trainer = SimpleNamespace(global_rank=rank, world_size=2)
            per_rank.append([tuple(batch) for batch in dm.val_dataloader().batch_sampler])
    finally:
        dm.trainer = None
    assert len(per_rank[0]) == len(per_rank[1])
    distinct = set(per_rank[0]) | set(per_rank[1])
    flat = [i for batch in distinct for i in batch]
    assert sorted(flat) == list(range(len(dm.datasets["valid"])))  # every pair in exactly one distinct batch


def test_skipping_more_than_the_allowed_fraction_of_a_split_is_an_error(data_dir, cache_dir):
    """Positions below the data (or a misaligned corpus) must not train on what is left, silently."""
    module = multi30k_dm(data_dir, cache_dir, max_skipped_fraction=0.01)
    with pytest.raises(SeqmixError, match=r"of the 29,000 train pairs \(1\.6%\) are longer than max_source_positions="
                                          r"40.*max_skipped_fraction=0\.01"):
        module.setup()
    allowed = multi30k_dm(data_dir, cache_dir, max_skipped_fraction=0.05)
    allowed.setup()
    assert 0.01 * 29_000 < allowed.num_skipped["train"] <= 0.05 * 29_000


def test_skipped_eval_pairs_are_logged_as_warning(data_dir, cache_dir, caplog):
    module = multi30k_dm(data_dir, cache_dir, max_source_positions=20, max_target_positions=20)
    with caplog.at_level(logging.INFO, logger=dm_module.__name__):
        module.setup()
    levels = {r.levelno for r in caplog.records if "skipped" in r.getMessage()}
    assert levels == {logging.INFO, logging.WARNING}
    assert f"skipped {module.num_skipped['valid']} of 1014" in caplog.text
    assert len(module.references("valid")) == len(module.datasets["valid"]) == 1014 - module.num_skipped["valid"]


def test_collate_pairs_exact():
    ds = PairDataset.from_lists([[5, 6, 7], [8]], [[9], [10, 11, 12]], ["a", "b"], ["c", "d"])
    batch = collate_pairs([ds[1], ds[0]], pad=1, bos=0, eos=2)
    assert batch["id"].tolist() == [1, 0]
    assert batch["src_tokens"].tolist() == [[8, 2, 1, 1], [5, 6, 7, 2]]
    assert batch["src_lengths"].tolist() == [2, 4]
    assert batch["target"].tolist() == [[10, 11, 12, 2], [9, 2, 1, 1]]
    assert batch["prev_output_tokens"].tolist() == [[0, 10, 11, 12], [0, 9, 1, 1]]
    assert batch["ntokens"] == 6 and batch["nsentences"] == 2
    assert ds.src_sizes.tolist() == [4, 2] and ds.tgt_sizes.tolist() == [2, 4]


def test_toy_task_end_to_end(tmp_path):
    toy = ToyReverseSource(num_train=300, num_valid=20, num_test=20)
    module = TranslationDataModule(toy, "src", "tgt", {"train": "train", "valid": "valid", "test": "test"},
                                   {"vocab_size": 60, "min_frequency": 1}, max_tokens=256, cache_dir=str(tmp_path))
    module.setup()
    assert set(module.datasets) == {"train", "valid", "test"} and sum(module.num_skipped.values()) == 0
    batch = next(iter(module.test_dataloader()))
    for row, i in enumerate(batch["id"].tolist()):
        assert module.tokenizer.decode(batch["target"][row]) == module.references("test")[i]


class EmptySource:
    def read(self, split):
        return ParallelCorpus([], [])


def test_config_errors(tmp_path):
    with pytest.raises(SeqmixError, match="no examples"):
        TranslationDataModule(EmptySource(), "en", "de", {"train": "train"}, {}, cache_dir=str(tmp_path)).setup()
    with pytest.raises(SeqmixError, match="'train'"):
        TranslationDataModule(EmptySource(), "en", "de", {"valid": "val"}, {}, cache_dir=str(tmp_path))
    with pytest.raises(SeqmixError, match="joint=true"):
        TranslationDataModule(EmptySource(), "en", "de", {"train": "t"}, {"joint": False}, cache_dir=str(tmp_path))
    with pytest.raises(SeqmixError, match="vocab"):
        TranslationDataModule(EmptySource(), "en", "de", {"train": "t"}, {"vocab": 8}, cache_dir=str(tmp_path))


@pytest.mark.filterwarnings("ignore:.*validation_step", "ignore:.*treespec")
def test_lightning_reshuffles_each_epoch(tmp_path):
    """Lightning only calls ``batch_sampler.sampler.set_epoch``; check that really reaches our sampler."""
    import lightning

    first_ids = []

    class Probe(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, i):
            if i == 0:
                first_ids.append(batch["id"].tolist())
            return self.w.sum() * batch["ntokens"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    toy = ToyReverseSource(num_train=200, num_valid=10, num_test=10)
    module = TranslationDataModule(toy, "src", "tgt", {"train": "train"}, {"vocab_size": 60, "min_frequency": 1},
                                   max_tokens=128, cache_dir=str(tmp_path))
    trainer = lightning.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(Probe(), module)
    assert len(first_ids) == 2 and first_ids[0] != first_ids[1]
    assert trainer.train_dataloader.batch_sampler.epoch == 1
