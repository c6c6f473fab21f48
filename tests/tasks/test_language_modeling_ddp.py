"""LanguageModelingTask under real DDP: two CPU processes (gloo), each rank trains and validates on distinct
blocks, and the validation perplexity aggregated over the ranks equals the perplexity of the whole split computed
in one process (float64, with eval_context). The translation task's DDP run is tests/test_train.py."""

from __future__ import annotations

import functools
import json
import math
import os
import socket

import numpy as np
import pytest
import torch
import torch.nn.functional as F

TEXT = ["the cat sat on the mat .", "a dog ran in the park .", "", "the dog sat on the cat and the mat .",
        "a cat ran .", "on the mat the cat sat", "the park was green ."]
TOKENS_PER_SAMPLE, CONTEXT = 5, 3
# odd batch counts (15 train, 11 valid at max_tokens=24): one rank gets a repeated batch, which training takes
# again and evaluation must not count twice
TRAIN, VALID = TEXT * 6 + TEXT[:1], TEXT[::-1] * 3 + TEXT[:2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def datamodule(data_dir: str, cache_dir: str):
    from seqmix.data import LanguageModelingDataModule, LocalTextSource

    return LanguageModelingDataModule(LocalTextSource(data_dir), {"train": "train", "valid": "valid"},
                                      {"kind": "word"}, tokens_per_sample=TOKENS_PER_SAMPLE, eval_context=CONTEXT,
                                      max_tokens=24, max_positions=32, cache_dir=cache_dir)


def tiny_lm(tok):
    from seqmix.mixers import SelfAttention
    from seqmix.models import DecoderOnly

    torch.manual_seed(0)
    return DecoderOnly(tok.vocab_size, tok.pad, 16, dict(layers=1, ffn_dim=32, normalize_before=True,
                                                         mixer=functools.partial(SelfAttention, num_heads=2)),
                       dropout=0.0, max_positions=32)


def worker(rank: int, port: int, data_dir: str, out_dir: str) -> None:
    """One rank, as a launcher (torchrun, SLURM) would start it: Lightning sees LOCAL_RANK and does not spawn."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank), NODE_RANK="0",
                      WORLD_SIZE="2", RANK=str(rank))
    torch.set_num_threads(1)
    import lightning as L

    from seqmix.tasks import LanguageModelingTask

    dm = datamodule(data_dir, os.path.join(out_dir, "cache"))
    dm.setup()
    task = LanguageModelingTask(tiny_lm(dm.tokenizer), dm.tokenizer, functools.partial(torch.optim.Adam, lr=1e-2),
                                tokens_per_sample=TOKENS_PER_SAMPLE, eval_context=CONTEXT)
    seen = {"train": [], "valid": []}

    class Record(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen["train"].append(batch["id"].tolist())

        def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
            seen["valid"].append(batch["id"].tolist())

    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", precision="64-true", max_epochs=1,
                        use_distributed_sampler=False, num_sanity_val_steps=0, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[Record()])
    trainer.fit(task, datamodule=dm)
    report = task.reports["valid"]
    result = {"rank": trainer.global_rank, "world": trainer.world_size, "seen": seen, "ppl": report.score,
              "details": report.details, "logged_ppl": float(trainer.callback_metrics["val/ppl"])}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if rank == 0:
        torch.save(task.model.state_dict(), os.path.join(out_dir, "model.pt"))


def whole_split_perplexity(model, stream: torch.Tensor) -> tuple[float, int]:
    """One process, no data module: slide over the stream in blocks of TOKENS_PER_SAMPLE targets, each read with
    up to CONTEXT earlier tokens, full softmax over the tied table."""
    nll, count = 0.0, 0
    weight = model.decoder.embed_tokens.weight
    with torch.no_grad():
        for a in range(1, len(stream), TOKENS_PER_SAMPLE):
            b = min(a + TOKENS_PER_SAMPLE, len(stream))
            c = min(CONTEXT, a - 1)
            lp = F.log_softmax(model(stream[a - 1 - c: b - 1].unsqueeze(0))[0] @ weight.t(), dim=-1)[c:]
            nll -= float(lp.gather(1, stream[a:b].unsqueeze(1)).sum())
            count += b - a
    return math.exp(nll / count), count


@pytest.mark.slow
def test_two_process_gloo_ddp_distinct_blocks_and_aggregated_perplexity(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("".join(line + "\n" for line in TRAIN), encoding="utf-8")
    (data / "valid.txt").write_text("".join(line + "\n" for line in VALID), encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    dm = datamodule(str(data), str(out / "cache"))
    dm.setup()  # also fills the cache the ranks read
    torch.multiprocessing.spawn(worker, args=(free_port(), str(data), str(out)), nprocs=2, join=True)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [(r["rank"], r["world"]) for r in ranks] == [(0, 2), (1, 2)]

    for split in ("train", "valid"):
        batches = [[tuple(b) for b in r["seen"][split]] for r in ranks]
        assert len(batches[0]) == len(batches[1]) >= 2, split  # equal step counts (collectives stay in step)
        assert len(set(batches[0]) & set(batches[1])) == 1, split  # distinct, bar the repeat that evens counts
        ids = sorted(i for b in set(batches[0]) | set(batches[1]) for i in b)
        assert ids == list(range(len(dm.datasets[split]))), split  # together: every block once

    model = tiny_lm(dm.tokenizer).double().eval()
    model.load_state_dict(torch.load(out / "model.pt", weights_only=True))
    stream = torch.as_tensor(np.asarray(dm.datasets["valid"].stream, dtype=np.int64))
    expect, count = whole_split_perplexity(model, stream)
    assert count == sum(len(line.split()) + 1 for line in VALID)
    for r in ranks:  # every rank reports the whole split, not its half (nor the repeated batch twice)
        assert r["ppl"] == pytest.approx(expect, rel=1e-9)
        assert r["logged_ppl"] == pytest.approx(expect, rel=1e-6)  # Lightning logs float32
        assert f"over {count} words" in r["details"][0]
