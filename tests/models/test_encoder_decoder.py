"""The encoder-decoder backbone: positions, embeddings sharing, incremental decoding, padding."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from seqmix.errors import SeqmixError
from seqmix.layers.embeddings import make_positions, sinusoidal_table
from seqmix.mixers import SelfAttention
from seqmix.models import EncoderDecoder, count_parameters

PAD = 1


def small_model(**kw):
    torch.manual_seed(0)
    mix = functools.partial(SelfAttention, num_heads=2)
    args = dict(encoder=dict(layers=2, ffn_dim=32, mixer=mix),
                decoder=dict(layers=2, ffn_dim=32, mixer=mix, cross_attention_heads=2), dropout=0.0)
    args.update(kw)
    return EncoderDecoder(40, 40, PAD, 16, **args).eval()


def test_sinusoidal_table_matches_formula():
    d, n = 8, 12
    table = sinusoidal_table(n, d, PAD)
    half = d // 2
    for pos in range(n):
        for i in range(half):
            freq = math.exp(-math.log(10000) * i / (half - 1))
            expect_sin = 0.0 if pos == PAD else math.sin(pos * freq)
            expect_cos = 0.0 if pos == PAD else math.cos(pos * freq)
            assert table[pos, i].item() == pytest.approx(expect_sin, abs=1e-5)
            assert table[pos, half + i].item() == pytest.approx(expect_cos, abs=1e-5)


def test_positions_skip_padding_and_continue_with_offset():
    tokens = torch.tensor([[5, 6, 7, PAD], [5, PAD, PAD, PAD]])
    assert make_positions(tokens, PAD).tolist() == [[2, 3, 4, PAD], [2, PAD, PAD, PAD]]
    assert make_positions(torch.tensor([[9]]), PAD, offset=3).tolist() == [[5]]


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_step_by_step_decoding_equals_full(normalize_before, positions):
    mix = functools.partial(SelfAttention, num_heads=2)
    m = small_model(positions=positions,
                    encoder=dict(layers=2, ffn_dim=32, mixer=mix, normalize_before=normalize_before),
                    decoder=dict(layers=2, ffn_dim=32, mixer=mix, cross_attention_heads=2,
                                 normalize_before=normalize_before))
    src = torch.randint(4, 40, (3, 9))
    src[0, 6:] = PAD
    prev = torch.randint(4, 40, (3, 7))
    full = m(src, prev)
    enc = m.encode(src)
    state = m.init_decoder_state(enc)
    steps = torch.cat([m.decode(prev[:, i: i + 1], enc, state) for i in range(7)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_source_padding_does_not_change_outputs():
    m = small_model()
    src = torch.randint(4, 40, (1, 5))
    prev = torch.randint(4, 40, (1, 4))
    padded = torch.cat([src, torch.full((1, 3), PAD)], dim=1)
    torch.testing.assert_close(m(src, prev), m(padded, prev), atol=1e-5, rtol=1e-5)


def test_padded_targets_keep_the_causal_attention_path(monkeypatch):
    """Right-padded decoder inputs need no mask in a causal stack: self-attention keeps ``is_causal`` (flash on
    GPUs) while cross-attention still masks source pads, and every real position equals the unpadded batch."""
    import seqmix.layers.attention as mha

    calls = []
    sdpa = mha.F.scaled_dot_product_attention

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
        calls.append((q.size(2), k.size(2), attn_mask is not None, is_causal))
        return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)

    m = small_model()
    src = torch.randint(4, 40, (2, 5))
    src[1, 3:] = PAD
    prev = torch.randint(4, 40, (2, 6))
    prev[1, 4:] = PAD
    monkeypatch.setattr(mha.F, "scaled_dot_product_attention", recording)
    out = m(src, prev)
    encoder, decoder = calls[:2], calls[2:]
    assert encoder == [(5, 5, True, False)] * 2
    assert decoder == [(6, 6, False, True), (6, 5, True, False)] * 2  # self-attention, then cross-attention
    alone = m(src[1:, :3], prev[1:, :4])
    torch.testing.assert_close(out[1:, :4], alone, atol=1e-5, rtol=1e-5)


def test_shared_embeddings_are_one_tensor():
    m = small_model(share_all_embeddings=True)
    assert m.encoder.embed_tokens.weight is m.decoder.embed_tokens.weight
    n_shared = count_parameters(m)
    n_sep = count_parameters(small_model(share_all_embeddings=False))
    assert n_sep - n_shared == 40 * 16
    untied = small_model(share_decoder_input_output_embed=False)
    assert count_parameters(untied) - n_sep == 40 * 16


def test_too_long_input_raises_clearly():
    m = small_model(max_source_positions=8)
    with pytest.raises(SeqmixError, match="max positions"):
        m.encode(torch.randint(4, 40, (1, 12)))


def test_unknown_stack_setting_is_rejected():
    with pytest.raises(SeqmixError, match="unknown encoder/decoder settings"):
        small_model(encoder=dict(layers=1, ffn_dim=8, mixer=None, attention_heads=3))
