"""The decoding fast paths change no result: per-sentence sources shared by a sentence's beams, finished sentences
leaving the batch, the time-major key/value cache, the ring-buffer conv step and the cached output weight are
checked in float64 against independent references (one sentence at a time, full passes over the reordered
inputs, F.linear on the current weight)."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from seqmix.generation import BeamSearch
from seqmix.mixers import DynamicConv, LightConv, SelfAttention
from seqmix.mixers.self_attention import KeyValueCache
from seqmix.models import EncoderDecoder

BOS, PAD, EOS = 0, 1, 2
C = 16


def translation_model(mixer) -> EncoderDecoder:
    torch.manual_seed(5)
    m = EncoderDecoder(30, 30, PAD, C, encoder=dict(layers=2, ffn_dim=32, mixer=mixer),
                       decoder=dict(layers=2, ffn_dim=32, mixer=mixer, cross_attention_heads=2), dropout=0.0)
    with torch.no_grad():  # hypotheses end at various lengths, so sentences finish at different steps
        m.decoder.embed_tokens.weight[EOS] *= 3
    return m.double().eval()


MIXERS = {"self_attention": functools.partial(SelfAttention, num_heads=2),
          "lightconv": functools.partial(LightConv, num_heads=2, kernel_size=[3, 5]),
          "dynamicconv": functools.partial(DynamicConv, num_heads=2, kernel_size=[3, 5])}


class CopiedSources:
    """The same model without ``for_beams``: beam search then copies every source row k times."""

    def __init__(self, model) -> None:
        self.encode, self.init_decoder_state, self.decode = model.encode, model.init_decoder_state, model.decode


def sources() -> torch.Tensor:
    torch.manual_seed(2)
    src = torch.randint(3, 30, (5, 9))
    src[1, 4:] = PAD
    src[3, 6:] = PAD
    src[4, 2:] = PAD
    return src


def assert_same_hypotheses(a, b) -> None:
    assert len(a) == len(b)
    for ha, hb in zip(a, b):
        assert torch.equal(ha.tokens, hb.tokens)
        assert ha.score == pytest.approx(hb.score, abs=1e-10)
        torch.testing.assert_close(ha.positional_scores, hb.positional_scores, atol=1e-10, rtol=0)


@pytest.mark.parametrize("mixer", sorted(MIXERS))
@pytest.mark.parametrize("beam", [1, 3])
def test_batched_beam_search_equals_one_sentence_at_a_time(mixer, beam, monkeypatch):
    """Shared sources and dropped finished sentences vs each sentence alone with copied sources (no drops)."""
    model = translation_model(MIXERS[mixer])
    search = BeamSearch(BOS, EOS, PAD, beam_size=beam, max_len_a=1.5, max_len_b=3)
    kept_rows = []
    original = KeyValueCache.reorder
    monkeypatch.setattr(KeyValueCache, "reorder", lambda self, index: (kept_rows.append(index.numel()),
                                                                       original(self, index))[1])
    src = sources()
    batched = search.generate(model, src)
    for i in range(src.size(0)):
        row = src[i: i + 1, : int(src[i].ne(PAD).sum())]
        assert_same_hypotheses(batched[i], search.generate(CopiedSources(model), row)[0])
    if mixer == "self_attention":  # some sentence finished early and left the batch
        assert any(n < src.size(0) * beam for n in kept_rows)


def test_shared_sources_equal_copied_sources_without_drops():
    model = translation_model(MIXERS["self_attention"])
    search = BeamSearch(BOS, EOS, PAD, beam_size=4, max_len_a=1.0, max_len_b=4)
    for a, b in zip(search.generate(model, sources()), search.generate(CopiedSources(model), sources())):
        assert_same_hypotheses(a, b)


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_step_cache_follows_reorders_drops_and_chunks(mixer):
    """Steps past the cache's first capacity (16) and the ring's length, beam-like reorders, rows dropped, a
    chunk of several steps: every output equals a full pass over each row's own history."""
    torch.manual_seed(0)
    m = MIXERS[mixer](embed_dim=C, causal=True, layer_idx=1).double().eval()
    rows, steps = 6, 21
    x = torch.randn(rows, steps, C, dtype=torch.float64)
    history = x[:, :0]
    state = m.init_state()
    t = 0
    with torch.no_grad():
        while t < steps:
            n = 3 if t == 10 else 1
            out = m(x[:, t: t + n], state=state)
            history = torch.cat([history, x[:, t: t + n]], dim=1)
            torch.testing.assert_close(out, m(history)[:, -n:], atol=1e-10, rtol=0)
            t += n
            index = torch.randperm(x.size(0))
            if t == 13:
                index = index[:4]  # rows leave the batch
            state.reorder(index)
            x, history = x[index], history[index]


def test_cached_output_weight_follows_updates_and_loads():
    model = translation_model(MIXERS["self_attention"])
    x = torch.randn(3, 2, C, dtype=torch.float64)

    def check():
        with torch.no_grad():
            tol = 1e-12 if x.dtype == torch.float64 else 1e-5  # a stale copy would be off by far more
            torch.testing.assert_close(model.output_layer(x), F.linear(x, model.output_weight()), atol=tol, rtol=0)

    check()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model.output_layer(x).sum().backward()
    opt.step()
    check()
    other = translation_model(MIXERS["self_attention"])
    with torch.no_grad():
        other.decoder.embed_tokens.weight.mul_(2)
    model.load_state_dict(other.state_dict())
    check()
    model.float()
    x = x.float()
    check()
