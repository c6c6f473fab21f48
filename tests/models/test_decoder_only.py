"""The decoder-only backbone: the encoder-decoder's causal Stack without cross-attention, for every mixer."""

from __future__ import annotations

import functools

import pytest
import torch

from seqmix.mixers import DynamicConv, LightConv, SelfAttention, TaLK
from seqmix.models import DecoderOnly
from seqmix.models.blocks import Block
from seqmix.models.encoder_decoder import Stack

PAD, V = 1, 40
MIXERS = {
    "self_attention": functools.partial(SelfAttention, num_heads=2),
    "lightconv": functools.partial(LightConv, num_heads=2, kernel_size=[3, 5]),
    "dynamicconv": functools.partial(DynamicConv, num_heads=2, kernel_size=[3, 5]),
    "talk": functools.partial(TaLK, num_heads=2, kernel_size=[3, 5]),
}


def lm(mixer, cutoffs=(10, 20), **kw):
    torch.manual_seed(0)
    return DecoderOnly(V, PAD, 16, dict(layers=2, ffn_dim=32, mixer=MIXERS[mixer], normalize_before=True,
                                        cross_attention_heads=4, attention_dropout=0.1),
                       dropout=0.0, input_cutoffs=cutoffs, softmax_cutoffs=cutoffs, **kw).eval()


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_shared_blocks_without_cross_attention(mixer):
    m = lm(mixer)
    assert isinstance(m.decoder, Stack)
    assert all(isinstance(b, Block) and b.cross_attn is None for b in m.decoder.layers)
    assert all(b.mixer.causal for b in m.decoder.layers)


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_causal_and_step_by_step_equals_full(mixer):
    m = lm(mixer)
    x = torch.randint(4, V, (2, 9))
    full = m(x)
    later = x.clone()
    later[:, 5:] = torch.randint(4, V, (2, 4))
    assert torch.allclose(m(later)[:, :5], full[:, :5], atol=1e-5)
    assert not torch.allclose(m(later)[:, 5:], full[:, 5:], atol=1e-3)
    state = m.init_state()
    steps = torch.cat([m(x[:, i: i + 1], state) for i in range(9)], dim=1)
    assert torch.allclose(steps, full, atol=1e-5)


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_right_padding_leaves_real_positions_alone(mixer):
    m = lm(mixer)
    x = torch.randint(4, V, (1, 6))
    padded = torch.cat([x, torch.full((1, 3), PAD)], dim=1)
    assert torch.allclose(m(padded)[:, :6], m(x), atol=1e-5)


def test_untied_head_has_its_own_weights():
    tied, untied = lm("self_attention", tie_weights=True), lm("self_attention", tie_weights=False)
    assert tied.output.bands[0].embed.weight is tied.decoder.embed_tokens.bands[0].embed.weight
    assert untied.output.bands[0].embed.weight is not untied.decoder.embed_tokens.bands[0].embed.weight
    x = torch.randint(4, V, (2, 5))
    lp = untied.log_probs(untied(x))
    assert torch.allclose(lp.exp().sum(-1), torch.ones(2, 5), atol=1e-5)
