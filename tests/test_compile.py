"""``compile: true``: compiled training updates give the eager loss and gradients, a batch of new sizes reuses the
compiled graphs, the non-finite guard still stops training, and checkpoints, validation and decoding stay eager.

Compiling on CPU is slow, so the tests share one tiny Transformer whose structure is the same everywhere: dynamo's
cache belongs to the process, so its graphs are compiled once (by the first test that needs them) and reused.
LightConv and DynamicConv compile too, their conv core run eagerly inside the graph (``test_conv_mixers_...``).
"""

from __future__ import annotations

import copy
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader

from seqmix.config.build import build_task
from seqmix.config.resolvers import register_resolvers
from seqmix.errors import SeqmixError
from seqmix.models.compiled import check_setting, enabled
from seqmix.training.checkpoints import load_weights
from tests.helpers import run_config

register_resolvers()
CONF = Path(__file__).resolve().parents[1] / "conf"
SIDES = ("encoder", "decoder")
TINY = ["task.data.source.num_train=200", "task.data.source.num_valid=20", "task.data.source.num_test=20",
        "task.data.max_tokens=256", "model.embed_dim=16", "model.dropout=0", "compile=true",
        *[f"model.{side}.{key}" for side in SIDES for key in ("layers=2", "ffn_dim=32", "heads=2")]]
# both conv mixers on both sides, with their Triton ops (what CUDA runs; the interpreter here, set by conftest)
CONVS = [*[f"+mixer@model.{side}.legend.{key}={name}" for side in SIDES for key, name in (("D", "dynamicconv"),
                                                                                        ("L", "lightconv"))],
         *[f"+model.{side}.pattern=DL" for side in SIDES],
         *[f"model.{side}.legend.{key}.{option}" for side in SIDES for key in "DL"
           for option in ("input_dropout=0", "kernel_backend=triton")]]


def tiny_config(tmp_path: Path, extra=()):
    return run_config([*TINY, *extra, f"task.data.cache_dir={tmp_path / 'cache'}"])


def tasks(cfg) -> tuple:
    """(data module, a compiled-training task, an eager copy with the same weights)."""
    datamodule = instantiate(cfg.task.data, _convert_="all")
    datamodule.setup("fit")
    torch.manual_seed(0)
    task = build_task(cfg, datamodule.tokenizer)
    eager = copy.deepcopy(task)
    eager.compile_training = False
    return datamodule, task, eager


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    cfg = tiny_config(tmp_path_factory.mktemp("compile"))
    return cfg, *tasks(cfg)


def padded_batches(datamodule) -> list[dict]:
    """Two batches with pads on both sides (an unpadded side is another, rarer, graph), each with its own number of
    sentences, source length and target length (toy targets are as long as their sources: pair them off)."""
    data, collate = datamodule.datasets["train"], datamodule.collate_fn()
    by_length = {}
    for i in range(len(data)):
        by_length.setdefault(len(data[i]["source"]), []).append(i)
    short = by_length[min(by_length)]

    def batch(size, src_length, tgt_length):
        sources = [by_length[src_length][0], *short[:size - 1]]
        targets = [by_length[tgt_length][1], *short[size:2 * size - 1]]
        return collate([{**data[i], "target": data[j]["target"]} for i, j in zip(sources, targets)])

    out = [batch(6, 9, 7), batch(9, 11, 13)]
    assert [(*b["src_tokens"].shape, b["target"].size(1)) for b in out] == [(6, 9, 7), (9, 11, 13)]
    return out


def loss_and_grads(task, batch: dict) -> tuple[torch.Tensor, torch.Tensor, dict]:
    task.train()
    task.zero_grad(set_to_none=True)
    loss, nll, _ = task.compute_loss(batch)
    (loss + 0.5 * nll).backward()
    return loss.detach(), nll.detach(), {n: p.grad for n, p in task.named_parameters()}


def check_same(task, eager, batch: dict) -> None:
    got, want = loss_and_grads(task, batch), loss_and_grads(eager, batch)
    torch.testing.assert_close(got[:2], want[:2], rtol=1e-5, atol=1e-5)
    assert got[2].keys() == want[2].keys() and all(g is not None for g in want[2].values())
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], rtol=1e-4, atol=1e-5, msg=name)


def test_compiled_loss_and_gradients_match_eager_and_new_sizes_do_not_recompile(setup):
    """The first batch compiles; a batch with other sizes (sentences, source and target length) only runs the
    compiled graphs: no new graph is traced."""
    _, datamodule, task, eager = setup
    first, second = padded_batches(datamodule)
    graphs = counters["stats"]["unique_graphs"]
    check_same(task, eager, first)
    compiled = counters["stats"]["unique_graphs"] - graphs
    assert compiled > 0 and "features" in task._compiled  # the compiled path ran
    check_same(task, eager, second)
    assert counters["stats"]["unique_graphs"] - graphs == compiled


def test_validation_decoding_and_checkpoints_use_the_eager_model(setup):
    _, _, task, _ = setup
    task.eval()
    fn = task.decoder_features
    assert task.compiled("features", fn) is fn  # validation (eval mode) and decoding run eagerly
    task.train()
    with torch.no_grad():
        assert task.compiled("features", fn) is fn
    assert task.compiled("features", fn) is not fn
    assert not [k for k in task.state_dict() if "_orig_mod" in k]
    assert [type(m).__name__ for m in task.children()] == ["EncoderDecoder"]


def test_nonfinite_guard_stops_a_compiled_run_and_checkpoints_load_eagerly(setup, tmp_path):
    """A NaN loss in update 5 of a compiled run ends it with the guard's error before the next checkpoint; the
    checkpoint written before loads into an eager model with the same keys."""
    cfg, datamodule, _, _ = setup
    task = build_task(cfg, datamodule.tokenizer)
    clean = task.compute_loss

    def poisoned(batch):
        loss, nll, ntokens = clean(batch)
        return (loss * float("nan"), nll, ntokens) if task.global_step == 5 else (loss, nll, ntokens)

    task.compute_loss = poisoned
    ckpts = tmp_path / "ckpts"
    trainer = L.Trainer(max_steps=12, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        limit_val_batches=0, num_sanity_val_steps=0, default_root_dir=str(tmp_path),
                        callbacks=[ModelCheckpoint(dirpath=ckpts, every_n_train_steps=4, save_top_k=-1)])
    with pytest.raises(SeqmixError, match="non-finite at step 5"):  # the batches whose graphs are compiled already
        trainer.fit(task, train_dataloaders=DataLoader(padded_batches(datamodule) * 6, batch_size=None))
    assert "features" in task._compiled and trainer.global_step == 5
    assert sorted(p.name for p in ckpts.glob("*.ckpt")) == ["epoch=0-step=4.ckpt"]
    eager = build_task(cfg, datamodule.tokenizer)
    eager.compile_training = False
    load_weights(eager, str(ckpts / "epoch=0-step=4.ckpt"))
    saved = torch.load(ckpts / "epoch=0-step=4.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert saved.keys() == eager.state_dict().keys()


def test_conv_mixers_compile_and_match_eager(tmp_path):
    """LightConv and DynamicConv: their conv core runs eagerly inside the compiled graph (HeadConvolution.convolve)."""
    datamodule, task, eager = tasks(tiny_config(tmp_path, CONVS))
    for batch in padded_batches(datamodule):
        check_same(task, eager, batch)


def test_settings():
    assert [check_setting(v) for v in (True, False, "auto", None)] == [True, False, "auto", False]
    with pytest.raises(SeqmixError, match="true, false or auto"):
        check_setting("yes")
    assert enabled(True, "cpu") and not enabled(False, "cuda") and not enabled("auto", "cpu")
