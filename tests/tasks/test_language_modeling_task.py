"""LanguageModelingTask: perplexity is exp(mean NLL) over the whole split; a tiny LM learns real WikiText-2."""

from __future__ import annotations

import functools
import math

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from seqmix.data import LanguageModelingDataModule, LocalTextSource
from seqmix.data.lm_blocks import token_stream
from seqmix.errors import SeqmixError
from seqmix.mixers import DynamicConv, SelfAttention
from seqmix.models import DecoderOnly
from seqmix.tasks import LanguageModelingTask

MIXERS = {"self_attention": functools.partial(SelfAttention, num_heads=2),
          "dynamicconv": functools.partial(DynamicConv, num_heads=2, kernel_size=[3, 5])}


def wikitext_valid(shared_data, tmp_path, **kw) -> LanguageModelingDataModule:
    """valid.txt as both splits: real text, quick to tokenize."""
    args = {"tokens_per_sample": 32, "max_tokens": 512, "cache_dir": str(tmp_path), **kw}
    dm = LanguageModelingDataModule(LocalTextSource(str(shared_data / "wikitext-2")),
                                    {"train": "valid", "valid": "valid"}, {"kind": "word"}, **args)
    dm.setup()
    return dm


def tiny_task(tok, mixer="self_attention", cutoffs=(500, 2000), **kw) -> LanguageModelingTask:
    torch.manual_seed(0)
    model = DecoderOnly(tok.vocab_size, tok.pad, 16, dict(layers=1, ffn_dim=32, mixer=MIXERS[mixer],
                                                         normalize_before=True),
                        dropout=0.0, input_cutoffs=cutoffs, softmax_cutoffs=cutoffs, max_positions=256)
    return LanguageModelingTask(model, tok, optimizer=functools.partial(torch.optim.Adam, lr=1e-2), **kw)


@pytest.fixture(scope="module")
def dm(shared_data, tmp_path_factory):
    return wikitext_valid(shared_data, tmp_path_factory.mktemp("lm"))


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_validation_perplexity_is_exp_mean_nll_over_the_split(dm, mixer):
    task = tiny_task(dm.tokenizer, mixer, tokens_per_sample=32).eval()
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, limit_val_batches=1.0, num_sanity_val_steps=0)
    trainer.validate(task, datamodule=dm, verbose=False)
    report = task.reports["valid"]
    # independently: full log-softmax (not the adaptive NLL path) over every 32-token block of the stream, block k
    # predicting stream[32k + 1: 32k + 33] from stream[32k: 32k + 32]; 8 blocks a batch (larger batches spend their
    # time faulting in the pages of their (B, 32, vocabulary) log-probs), the shorter last block alone
    stream = torch.as_tensor(np.asarray(dm.datasets["valid"].stream, dtype=np.int64))
    inputs, targets = stream[:-1], stream[1:]
    full = len(targets) // 32 * 32
    nll, count = 0.0, 0
    with torch.no_grad():
        for x, y in ((inputs[:full].view(-1, 32), targets[:full].view(-1, 32)),
                     (inputs[full:].unsqueeze(0), targets[full:].unsqueeze(0))):
            for i in range(0, len(x) if y.numel() else 0, 8):
                lp = task.model.log_probs(task.model(x[i: i + 8]))
                nll -= lp.gather(-1, y[i: i + 8].unsqueeze(-1)).sum().item()
                count += y[i: i + 8].numel()
    assert count == 217_646
    assert report.score == pytest.approx(math.exp(nll / count), rel=1e-4)
    assert report.headline.startswith("perplexity: ") and "217,646 words" in report.details[0]


def test_context_window_equals_one_pass_over_the_whole_text(dm):
    lines = ["the cat sat on the mat .", "", "a dog ran .", "the cat ran on the mat ."] * 3
    task = tiny_task(dm.tokenizer, tokens_per_sample=5).eval()
    _, blocked = task.evaluate_texts(lines, None, max_tokens=64, eval_context=200)
    ids = token_stream(dm.tokenizer.encode_batch(lines), dm.tokenizer.eos)
    with torch.no_grad():
        lp = F.log_softmax(task.model.log_probs(task.model(ids[:-1].unsqueeze(0)))[0], dim=-1)
    nll = -lp.gather(1, ids[1:].unsqueeze(1)).sum().item()
    assert blocked.score == pytest.approx(math.exp(nll / (len(ids) - 1)), rel=1e-5)
    _, short = task.evaluate_texts(lines, None, max_tokens=64)
    assert short.score != pytest.approx(blocked.score, rel=1e-3)  # without history the predictions differ
    assert "unscored context" in blocked.details[0] and "unscored context" not in short.details[0]


def test_optimizer_steps_lower_the_loss_on_real_wikitext2_batches(dm):
    batch = next(iter(dm.dataloader("train", shuffle=True)))
    task = tiny_task(dm.tokenizer, cutoffs=(2000, 8000))
    opt = task.optimizer_factory(params=task.parameters())
    losses = []
    for _ in range(8):
        loss, nll, ntok = task.compute_loss(batch)
        losses.append(loss.item() / ntok)
        opt.zero_grad()
        (loss / ntok).backward()
        opt.step()
    assert ntok == int(batch["target"].ne(dm.tokenizer.pad).sum()) > 0
    assert losses[0] == pytest.approx(math.log(dm.tokenizer.vocab_size), rel=0.15)  # about uniform at first
    assert losses[-1] < losses[0] - 1.0, losses


LINES = ["the cat sat on the mat .", "a dog ran .", "", "the cat ran on the mat and the dog sat on the cat .",
         "on the mat", "a cat ."]


def full_softmax_nll(model, inp: list[int], tgt: list[int]) -> float:
    """-sum log p(tgt | inp prefix) from the features and the tied table, with a plain log-softmax (float64)."""
    with torch.no_grad():
        feats = model(torch.tensor([inp]))[0]
        lp = F.log_softmax(feats @ model.decoder.embed_tokens.weight.t(), dim=-1)
        return -float(lp.gather(1, torch.tensor(tgt).unsqueeze(1)).sum())


@pytest.mark.parametrize("tokens_per_sample", [3, 64])
def test_eos_mode_perplexity_is_every_line_scored_alone(tokens_per_sample):
    """break_mode=eos: the split's NLL is the sum of each line's NLL computed alone from [</s>] + line, in chunks
    of tokens_per_sample (float64, independent full softmax); break_mode=none (history across lines) differs."""
    from seqmix.data.tokenizer import train_tokenizer

    tok = train_tokenizer(LINES, vocab_size=100, kind="word", min_frequency=1)
    task = tiny_task(tok, cutoffs=(), tokens_per_sample=tokens_per_sample, break_mode="eos").double().eval()
    _, report = task.evaluate_texts(LINES, None, max_tokens=64)
    nll, count = 0.0, 0
    for line in LINES:
        ids = [tok.eos, *tok.encode(line), tok.eos]
        for a in range(0, len(ids) - 1, tokens_per_sample):
            b = min(a + tokens_per_sample, len(ids) - 1)
            nll += full_softmax_nll(task.model, ids[a:b], ids[a + 1: b + 1])
            count += b - a
    assert count == sum(len(line.split()) + 1 for line in LINES)
    assert report.score == pytest.approx(math.exp(nll / count), rel=1e-10)
    assert f"over {count} words" in report.details[0] and "break_mode=eos" in report.details[0]
    task.break_mode = "none"
    _, across = task.evaluate_texts(LINES, None, max_tokens=64)
    assert across.score != pytest.approx(report.score, rel=1e-4)
    task.break_mode = "eos"
    with pytest.raises(SeqmixError, match="break_mode=none"):
        task.evaluate_texts(LINES, None, max_tokens=64, eval_context=4)
