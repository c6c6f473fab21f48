"""Hybrid stacks: a per-layer mixer pattern (DynamicConv, TaLK and self-attention in one stack) behaves like any
other stack: step-by-step decoding equals the full pass, padding changes nothing, caches follow the beams, beam
search gives what full recomputation gives; patterns that do not fit are clear errors."""

from __future__ import annotations

import pytest
import torch

from seqmix.config.mixer_group import mixer_factory
from seqmix.errors import SeqmixError
from seqmix.generation.beam_search import BeamSearch
from seqmix.mixers import DynamicConv, SelfAttention, TaLK
from seqmix.models import DecoderOnly, EncoderDecoder

PAD, BOS, EOS, V = 1, 0, 2, 40
LEGEND = {"D": mixer_factory("dynamicconv", kernel_size=[3, 5, 7]),
          "T": mixer_factory("talk", kernel_size=[2, 3, 4]),
          "A": mixer_factory("self_attention")}


def hybrid(pattern="DTA", **kw) -> EncoderDecoder:
    torch.manual_seed(0)
    side = dict(layers=len(pattern), ffn_dim=32, heads=2, pattern=pattern, legend=LEGEND)
    return EncoderDecoder(V, V, PAD, 16, encoder=side, decoder=side, dropout=0.0, **kw).eval()


def test_each_layer_gets_its_letters_mixer_with_the_sides_causality():
    m = hybrid("DTA")
    for stack, causal in ((m.encoder, False), (m.decoder, True)):
        mixers = [b.mixer for b in stack.layers]
        assert [type(x) for x in mixers] == [DynamicConv, TaLK, SelfAttention]
        assert all(x.causal == causal for x in mixers)
        assert [mixers[0].kernel_size, mixers[1].kernel_size] == [3, 3]  # per-layer lists indexed by stack position
        assert mixers[2].attn.num_heads == 2  # the stack's heads


def test_step_by_step_equals_full_and_padding_changes_nothing():
    m = hybrid("ADT")
    src = torch.randint(4, V, (3, 9))
    src[0, 6:] = PAD
    prev = torch.randint(4, V, (3, 7))
    full = m(src, prev)
    enc = m.encode(src)
    state = m.init_decoder_state(enc)
    steps = torch.cat([m.decode(prev[:, i: i + 1], enc, state) for i in range(7)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    alone = m(src[:1, :6], prev[:1])
    torch.testing.assert_close(full[:1], alone, atol=1e-5, rtol=1e-5)
    longer = torch.cat([prev, torch.full((3, 2), PAD)], dim=1)
    torch.testing.assert_close(m(src, longer)[:, :7], full, atol=1e-5, rtol=1e-5)


def test_decoder_caches_follow_reordered_beams():
    m = hybrid("DTA")
    src = torch.randint(4, V, (3, 8))
    prev = torch.randint(4, V, (3, 6))
    enc = m.encode(src)
    state = m.init_decoder_state(enc)
    for i in range(5):
        m.decode(prev[:, i: i + 1], enc, state)
    index = torch.tensor([2, 0, 0])
    state.reorder(index)
    step = m.decode(prev[index, 5:6], enc.index_select(index), state)
    torch.testing.assert_close(step[:, 0], m(src[index], prev[index])[:, 5], atol=1e-5, rtol=1e-5)


def test_beam_search_with_caches_equals_full_recomputation():
    m = hybrid("TDA")
    src = torch.randint(4, V, (2, 7))
    src[1, 5:] = PAD
    outs = [BeamSearch(BOS, EOS, PAD, beam_size=4, max_len_a=0, max_len_b=9, incremental=inc).generate(m, src)
            for inc in (True, False)]
    for cached, recomputed in zip(*outs):
        assert [h.tokens.tolist() for h in cached] == [h.tokens.tolist() for h in recomputed]
        assert [h.score for h in cached] == pytest.approx([h.score for h in recomputed], abs=1e-5)


def test_language_model_stack_takes_a_pattern():
    torch.manual_seed(0)
    lm = DecoderOnly(V, PAD, 16, dict(layers=3, ffn_dim=32, heads=2, pattern=["A", "D", "A"], legend=LEGEND),
                     dropout=0.0).eval()
    assert [type(b.mixer) for b in lm.decoder.layers] == [SelfAttention, DynamicConv, SelfAttention]
    x = torch.randint(4, V, (2, 6))
    state = lm.init_state()
    steps = torch.cat([lm(x[:, i: i + 1], state) for i in range(6)], dim=1)
    torch.testing.assert_close(steps, lm(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pattern,legend,message", [
    ("DA", LEGEND, "2 entries for 3 layers"),
    ("DXA", LEGEND, r"uses \['X'\]"),
])
def test_a_pattern_that_does_not_fit_is_a_clear_error(pattern, legend, message):
    side = dict(layers=3, ffn_dim=32, heads=2, pattern=pattern, legend=legend)
    with pytest.raises(SeqmixError, match=message):
        EncoderDecoder(V, V, PAD, 16, encoder=side, decoder=side)


@pytest.mark.parametrize("layers", [[[32, 3]], [], 0, -2, True, 2.0])
def test_a_stack_takes_only_a_whole_number_of_layers(layers):
    """ConvS2S's per-layer list, or anything but a count >= 1, is refused by the shared stack with what to pass."""
    from seqmix.models.stack import stack_settings

    with pytest.raises(SeqmixError, match="whole number of layers >= 1"):
        stack_settings({"layers": layers, "mixer": None}, cross_attention=False)
