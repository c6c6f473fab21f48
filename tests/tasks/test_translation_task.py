"""TranslationTask on real Multi30k batches: one optimizer step lowers the loss on a fixed batch."""

from __future__ import annotations

import functools

import torch

from seqmix.data import LocalParallelSource, TranslationDataModule
from seqmix.mixers import SelfAttention
from seqmix.models import EncoderDecoder
from seqmix.tasks import TranslationTask


def test_optimizer_steps_lower_loss_on_fixed_batch(shared_data, tmp_path):
    dm = TranslationDataModule(
        LocalParallelSource(str(shared_data / "multi30k"), "en", "de"), "en", "de",
        splits={"train": "val", "valid": "val", "test": None},
        tokenizer={"vocab_size": 1000, "lowercase": False, "min_frequency": 2, "joint": True},
        max_tokens=600, cache_dir=str(tmp_path),
    )
    dm.setup("fit")
    batch = next(iter(dm.dataloader("train")))
    tok = dm.tokenizer
    torch.manual_seed(0)
    mix = functools.partial(SelfAttention, num_heads=2)
    model = EncoderDecoder(tok.vocab_size, tok.vocab_size, tok.pad, 32, encoder=dict(layers=1, ffn_dim=64, mixer=mix),
                           decoder=dict(layers=1, ffn_dim=64, mixer=mix, cross_attention_heads=2), dropout=0.0)
    task = TranslationTask(model, tok, optimizer=functools.partial(torch.optim.Adam, lr=3e-3), label_smoothing=0.1)
    opt = task.optimizer_factory(params=task.parameters())
    losses = []
    for _ in range(5):
        loss, _, ntok = task.compute_loss(batch)
        losses.append(loss.item() / ntok)
        opt.zero_grad()
        (loss / ntok).backward()
        opt.step()
    assert losses[-1] < losses[0] - 0.5, losses
    assert ntok == int(batch["target"].ne(tok.pad).sum())
