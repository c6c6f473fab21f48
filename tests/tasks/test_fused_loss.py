"""The fused projection + label-smoothed loss equals projecting then calling the unfused loss."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from seqmix.config.build import task_options
from seqmix.mixers import SelfAttention
from seqmix.models import EncoderDecoder
from seqmix.tasks import TranslationTask
from seqmix.tasks.fused_loss import projected_label_smoothed_loss
from seqmix.tasks.losses import label_smoothed_nll_loss
from seqmix.tasks.nat_translation import NonAutoregressiveTranslationTask

PAD = 1
TOKENIZER = SimpleNamespace(bos=0, pad=PAD, eos=2, unk=3)


def inputs(n=37, c=12, v=300, pads=9, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(n, c, generator=g, dtype=dtype).requires_grad_()
    weight = torch.randn(v, c, generator=g, dtype=dtype).requires_grad_()
    target = torch.randint(0, v, (n,), generator=g)
    target[torch.randperm(n, generator=g)[:pads]] = PAD
    return features, weight, target


def loss_and_grads(fn, features, weight):
    loss, nll, count = fn(features, weight)
    (g_features, g_weight) = torch.autograd.grad(loss + 0.3 * nll, (features, weight))
    return loss.detach(), nll.detach(), count, g_features, g_weight


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("chunk_rows", [1, 5, 8, 1000])
def test_fused_matches_unfused_in_float64(epsilon, chunk_rows):
    features, weight, target = inputs()
    unfused = loss_and_grads(lambda f, w: label_smoothed_nll_loss(f @ w.t(), target, epsilon, PAD), features, weight)
    fused = loss_and_grads(lambda f, w: projected_label_smoothed_loss(f, w, target, epsilon, PAD,
                                                                      chunk_rows=chunk_rows), features, weight)
    assert fused[2] == unfused[2] == int(target.ne(PAD).sum())
    for a, b in zip(fused[:2] + fused[3:], unfused[:2] + unfused[3:]):
        assert a.dtype == torch.float64
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert fused[3][target.eq(PAD)].abs().max() == 0  # pads receive no gradient


def test_matches_plain_cross_entropy_and_accepts_batch_shapes():
    features, weight, target = inputs(n=24, pads=4)
    loss, nll, count = projected_label_smoothed_loss(features.view(4, 6, -1), weight, target.view(4, 6), 0.1, PAD,
                                                     chunk_rows=7)
    logits = features @ weight.t()
    expect_nll = F.cross_entropy(logits, target, ignore_index=PAD, reduction="sum")
    expect_loss = F.cross_entropy(logits, target, ignore_index=PAD, reduction="sum", label_smoothing=0.1 * 300 / 299)
    torch.testing.assert_close(nll, expect_nll)
    torch.testing.assert_close(loss, expect_loss)
    assert count == 20


def test_half_precision_inputs_get_fp32_loss_and_grads_in_their_dtype():
    features, weight, target = inputs(dtype=torch.float32)
    half = features.detach().bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, nll, _ = projected_label_smoothed_loss(half, weight, target, 0.1, PAD, chunk_rows=8)
    assert loss.dtype == nll.dtype == torch.float32
    loss.backward()
    assert half.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.float32
    reference, _, _ = label_smoothed_nll_loss(half.detach().float() @ weight.detach().t(), target, 0.1, PAD)
    torch.testing.assert_close(loss.detach(), reference, rtol=1e-5, atol=1e-4)


def test_rejects_empty_chunks_and_torch_backend_runs_on_cpu():
    features, weight, target = inputs()
    with pytest.raises(ValueError, match="chunk_rows"):
        projected_label_smoothed_loss(features, weight, target, 0.1, PAD, chunk_rows=0)
    loss, _, _ = projected_label_smoothed_loss(features, weight, target, 0.1, PAD, kernel_backend="torch")
    assert torch.isfinite(loss)


def tiny_task(fused: bool, untied: bool = False) -> TranslationTask:
    torch.manual_seed(0)
    mix = functools.partial(SelfAttention, num_heads=2)
    model = EncoderDecoder(50, 50, PAD, 16, encoder=dict(layers=1, ffn_dim=32, mixer=mix),
                           decoder=dict(layers=1, ffn_dim=32, mixer=mix, cross_attention_heads=2), dropout=0.0,
                           share_decoder_input_output_embed=not untied)
    return TranslationTask(model.double(), TOKENIZER, optimizer=None, label_smoothing=0.1, fused_loss=fused)


BATCH = {"src_tokens": torch.tensor([[5, 6, 7, 2], [8, 9, 2, PAD]]),
         "prev_output_tokens": torch.tensor([[2, 10, 11, 12, 13], [2, 14, 15, PAD, PAD]]),
         "target": torch.tensor([[10, 11, 12, 13, 2], [14, 15, 2, PAD, PAD]])}


@pytest.mark.parametrize("untied", [False, True])
def test_task_loss_and_grads_are_the_same_with_fused_loss_on_and_off(untied):
    results = []
    for fused in (False, True):
        t = tiny_task(fused, untied)
        loss, nll, count = t.compute_loss(BATCH)
        loss.backward()
        results.append((loss.detach(), nll.detach(), count, [p.grad.clone() for p in t.model.parameters()]))
    (loss0, nll0, n0, g0), (loss1, nll1, n1, g1) = results
    assert n0 == n1 == 8
    torch.testing.assert_close(loss1, loss0, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(nll1, nll0, rtol=1e-10, atol=1e-10)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10)


class LogitsOnly(nn.Module):
    """A model without decode_features / output_weight (like ConvS2S): only logits."""

    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(50, 50)
        self.calls = 0

    def forward(self, src_tokens, prev_output_tokens):
        self.calls += 1
        return self.table(prev_output_tokens)


def test_model_without_fused_methods_falls_back_to_logits():
    model = LogitsOnly()
    t = TranslationTask(model, TOKENIZER, optimizer=None, label_smoothing=0.1, fused_loss=True)
    loss, nll, count = t.compute_loss(BATCH)
    expect = label_smoothed_nll_loss(model.table(BATCH["prev_output_tokens"]), BATCH["target"], 0.1, PAD)
    assert model.calls == 1 and count == expect[2] == 8
    torch.testing.assert_close(loss, expect[0])


def test_option_comes_from_the_top_level_config_key():
    cfg = OmegaConf.create({"label_smoothing": 0.1, "task": {}, "fused_loss": True})
    assert task_options(TranslationTask, cfg)["fused_loss"] is True
    cfg.fused_loss = False
    assert task_options(TranslationTask, cfg)["fused_loss"] is False
    assert "fused_loss" not in task_options(NonAutoregressiveTranslationTask, cfg)  # has its own loss
