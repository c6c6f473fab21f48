"""ConvS2S (Gehring et al. 2017): incremental decoding, padding, the paper's scalings and initialization, presets,
and a few training steps on real Multi30k batches."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from omegaconf import OmegaConf
from torch.nn.utils import parametrize

from seqmix.errors import SeqmixError
from seqmix.models import count_parameters
from seqmix.models.convs2s import (
    AttentionMemory,
    ConvS2S,
    MultiStepAttention,
    linear,
    parse_layers,
    scale_gradient,
)
from seqmix.models.encoder_decoder import EncoderOut
from seqmix.models.glu_conv import GLUConv, glu_conv1d
from tests.test_configs import compose_train, resolve_outside_hydra

PAD, V = 1, 40
# mixed widths (projected residuals), an even kernel, kernel 1, a lookback of 2 and a block without residual
ENC_LAYERS = [[8, 3], [12, 2], [12, 3, 2], [8, 1]]
DEC_LAYERS = [[8, 3], [12, 2], [12, 3, 2], [8, 1, 0]]
DEC_ATTENTION = [True, False, True, True]


def tiny_settings(**kw) -> dict:
    settings = dict(encoder=dict(embed_dim=8, layers=ENC_LAYERS), dropout=0.0,
                    decoder=dict(embed_dim=8, out_embed_dim=6, layers=DEC_LAYERS, attention=DEC_ATTENTION))
    return {**settings, **kw}


def tiny(**kw) -> ConvS2S:
    torch.manual_seed(0)
    return ConvS2S(V, V, PAD, **tiny_settings(**kw)).double().eval()


def batch():
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, V, (3, 9), generator=gen)
    src[0, 6:] = PAD
    src[2, 4:] = PAD
    prev = torch.randint(4, V, (3, 7), generator=gen)
    prev[1, 5:] = PAD
    return src, prev


def set_weight(layer: torch.nn.Module, weight: torch.Tensor, bias: torch.Tensor) -> None:
    """Give a weight-normalized layer the effective weight ``weight`` (g = row norms, v = weight)."""
    with torch.no_grad():
        layer.parametrizations.weight.original1.copy_(weight)
        layer.parametrizations.weight.original0.copy_(weight.norm(dim=1, keepdim=True))
        layer.bias.copy_(bias)


# --- incremental decoding ---------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 3])
def test_step_by_step_equals_full_pass(chunk):
    m = tiny()
    src, prev = batch()
    full = m(src, prev)
    enc = m.encode(src)
    state = m.init_decoder_state(enc)
    steps = torch.cat([m.decode(prev[:, i: i + chunk], enc, state) for i in range(0, prev.size(1), chunk)], dim=1)
    assert state.step == prev.size(1)
    torch.testing.assert_close(steps, full, atol=1e-9, rtol=0)


def test_reorder_for_beams_equals_full_pass_on_reordered_rows():
    m = tiny()
    src, prev = batch()
    enc = m.encode(src)
    state = m.init_decoder_state(enc)
    head = m.decode(prev[:, :3], enc, state)
    order = torch.tensor([2, 0, 0, 1])  # beams are dropped, duplicated and moved across rows
    state.reorder(order)
    enc = enc.index_select(order)
    tail = torch.cat([m.decode(prev[order, i: i + 1], enc, state) for i in range(3, prev.size(1))], dim=1)
    full = m(src[order], prev[order])
    torch.testing.assert_close(torch.cat([head[order], tail], dim=1), full, atol=1e-9, rtol=0)


def test_decoder_is_causal():
    m = tiny()
    src, prev = batch()
    changed = prev.clone()
    changed[:, 4:] = torch.randint(4, V, changed[:, 4:].shape)
    torch.testing.assert_close(m(src, prev)[:, :4], m(src, changed)[:, :4], atol=1e-12, rtol=0)


# --- the GLU convolution mixer ------------------------------------------------------------------------------
def glu_conv_reference(mixer: GLUConv, x: torch.Tensor) -> torch.Tensor:
    """§3.2 with loops: Y_t = W·[x_{t−p}, …, x_{t−p+k−1}] + b (zeros outside the sequence), v([A B]) = A ⊗ σ(B);
    p = k−1 for the decoder, k//2 (odd k) or (k−1)//2 (even k, fairseq) for the encoder."""
    w, b = mixer.conv.weight.detach(), mixer.conv.bias.detach()
    k, out = mixer.kernel_size, mixer.out_dim
    p = k - 1 if mixer.causal else (k - 1) // 2
    y = torch.zeros(x.size(0), x.size(1), out, dtype=x.dtype)
    for t in range(x.size(1)):
        acc = b.expand(x.size(0), -1).clone()
        for j in range(k):
            src = t - p + j
            if 0 <= src < x.size(1):
                acc = acc + x[:, src] @ w[:, :, j].T
        y[:, t] = acc[:, :out] * torch.sigmoid(acc[:, out:])
    return y


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", [1, 2, 3, 4])
def test_glu_conv_matches_loop_reference(causal, kernel):
    torch.manual_seed(kernel)
    mixer = GLUConv(5, kernel, causal=causal, out_dim=7).double()
    x = torch.randn(2, 6, 5, dtype=torch.float64)
    torch.testing.assert_close(mixer(x), glu_conv_reference(mixer, x), atol=1e-12, rtol=0)
    if causal:
        state = mixer.init_state()
        steps = torch.cat([mixer(x[:, t: t + 1], state=state) for t in range(6)], dim=1)
        torch.testing.assert_close(steps, glu_conv_reference(mixer, x), atol=1e-12, rtol=0)


def test_glu_conv_zeroes_pads_and_refuses_state_in_the_encoder():
    torch.manual_seed(0)
    mixer = GLUConv(4, 3, out_dim=4).double()
    x = torch.randn(1, 5, 4, dtype=torch.float64)
    mask = torch.tensor([[False, False, False, True, True]])
    garbage = x.clone()
    garbage[:, 3:] = 100.0
    torch.testing.assert_close(mixer(garbage, key_padding_mask=mask)[:, :3], mixer(x[:, :3]), atol=1e-12, rtol=0)
    with pytest.raises(ValueError, match="causal"):
        mixer(x, state=GLUConv(4, 3, causal=True).init_state())


# --- padding ----------------------------------------------------------------------------------------------
def test_encoder_padding_changes_nothing():
    m = tiny()
    src, prev = batch()
    src, prev = src[1:2, :5], prev[1:2]  # row 1 has no source pads
    padded = torch.cat([src, torch.full((1, 4), PAD)], dim=1)
    short, long = m.encode(src), m.encode(padded)
    torch.testing.assert_close(long.out[:, :5], short.out, atol=1e-12, rtol=0)
    assert long.out[:, 5:].abs().max() == 0  # pads are zero keys
    torch.testing.assert_close(m(padded, prev), m(src, prev), atol=1e-12, rtol=0)


# --- the paper's scalings, checked against hand computations ----------------------------------------------
def test_attention_on_a_hand_computed_case():
    """One query, two real source tokens and a pad; identity projections. Every line is §3.3/§3.4 in scalars."""
    att = MultiStepAttention(2, 2).double()
    eye, zero = torch.eye(2, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    set_weight(att.in_projection, eye, zero)
    set_weight(att.out_projection, eye, zero)
    h, g = [1.0, 0.0], [1.0, 0.0]
    z = [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    e = [[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    mask = torch.tensor([[False, False, True]])
    enc = EncoderOut(torch.tensor([z], dtype=torch.float64), mask, torch.tensor([e], dtype=torch.float64))
    out = att(torch.tensor([[h]], dtype=torch.float64), torch.tensor([[g]], dtype=torch.float64),
              AttentionMemory.from_encoder_out(enc))

    r = math.sqrt(0.5)
    d = [(h[0] + g[0]) * r, (h[1] + g[1]) * r]  # d = (W h + b + g)·√0.5 with W = I, b = 0
    scores = [d[0] * z[j][0] + d[1] * z[j][1] for j in range(2)]  # the pad gets no weight
    a = [math.exp(s) / sum(math.exp(t) for t in scores) for s in scores]
    values = [[(z[j][k] + e[j][k]) * r for k in range(2)] for j in range(2)]
    m = 2
    c = [sum(a[j] * values[j][k] for j in range(2)) * m * math.sqrt(1 / m) for k in range(2)]
    expected = [(c[k] + h[k]) * r for k in range(2)]  # (W c + b + h)·√0.5
    torch.testing.assert_close(out, torch.tensor([[expected]], dtype=torch.float64), atol=1e-12, rtol=0)


def test_attention_matches_loop_reference_with_padding():
    torch.manual_seed(3)
    att = MultiStepAttention(5, 4).double()
    b, t, s = 2, 3, 6
    h, g = torch.randn(b, t, 5, dtype=torch.float64), torch.randn(b, t, 4, dtype=torch.float64)
    z, e = torch.randn(b, s, 4, dtype=torch.float64), torch.randn(b, s, 4, dtype=torch.float64)
    mask = torch.zeros(b, s, dtype=torch.bool)
    mask[1, 2:] = True
    z = z.masked_fill(mask.unsqueeze(-1), 0.0)
    out = att(h, g, AttentionMemory.from_encoder_out(EncoderOut(z, mask, e)))
    w_in, b_in = att.in_projection.weight.detach(), att.in_projection.bias.detach()
    w_out, b_out = att.out_projection.weight.detach(), att.out_projection.bias.detach()
    expected = torch.zeros_like(out)
    for bi in range(b):
        real = [j for j in range(s) if not mask[bi, j]]
        m = len(real)
        for i in range(t):
            d = (w_in @ h[bi, i] + b_in + g[bi, i]) * math.sqrt(0.5)
            weights = torch.stack([torch.exp(d @ z[bi, j]) for j in real])
            weights = weights / weights.sum()
            c = sum(weights[n] * (z[bi, j] + e[bi, j]) * math.sqrt(0.5) for n, j in enumerate(real))
            c = c * m * math.sqrt(1.0 / m)
            expected[bi, i] = (w_out @ c + b_out + h[bi, i]) * math.sqrt(0.5)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)


def test_scale_gradient_is_identity_forward_and_scales_backward():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64)
    y = scale_gradient(x, 0.125)
    assert torch.equal(y, x)
    (y * w).sum().backward()
    torch.testing.assert_close(x.grad, 0.125 * w, atol=0, rtol=0)


def _encoder_block_grads(m: ConvS2S, src, prev) -> dict[str, torch.Tensor]:
    m.zero_grad()
    m(src, prev).pow(2).sum().backward()
    return {n: p.grad.clone() for n, p in m.encoder.named_parameters() if not n.startswith("embed_")}


def test_encoder_gradient_is_scaled_by_one_over_twice_the_attention_layers():
    m = tiny()
    src, prev = batch()
    n_attention = sum(DEC_ATTENTION)
    assert m.encoder_grad_scale == 1.0 / (2 * n_attention)
    out_scaled = m(src, prev)
    scaled = _encoder_block_grads(m, src, prev)
    m.encoder_grad_scale = 1.0
    torch.testing.assert_close(m(src, prev), out_scaled, atol=0, rtol=0)  # forward unchanged
    plain = _encoder_block_grads(m, src, prev)
    assert scaled.keys() == plain.keys() and len(scaled) > 0
    for name in scaled:
        assert plain[name].abs().max() > 0, name
        torch.testing.assert_close(scaled[name], plain[name] / (2 * n_attention), atol=1e-15, rtol=1e-12)


def test_source_embeddings_reach_the_attention_values_unscaled():
    """§3.4 excludes the source word embeddings: with the encoder's output layer at zero, z no longer depends on
    them, so their gradient comes through the values (z + e)·√0.5 alone and must not change with the scale."""
    m = tiny()
    src, prev = batch()
    with torch.no_grad():
        m.encoder.fc2.parametrizations.weight.original0.zero_()

    def embed_grad():
        m.zero_grad()
        m(src, prev).pow(2).sum().backward()
        return m.encoder.embed_tokens.weight.grad.clone()

    scaled = embed_grad()
    m.encoder_grad_scale = 1.0
    assert scaled.abs().max() > 0
    torch.testing.assert_close(scaled, embed_grad(), atol=1e-15, rtol=1e-12)


# --- weight normalization and initialization --------------------------------------------------------------
def _weight_norm_parts(layer):
    assert parametrize.is_parametrized(layer, "weight")
    return layer.parametrizations.weight.original0, layer.parametrizations.weight.original1


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_linear_init_and_weight_norm(dropout):
    torch.manual_seed(0)
    n_in, n_out = 512, 1024
    layer = linear(n_in, n_out, dropout)
    g, v = _weight_norm_parts(layer)
    assert g.shape == (n_out, 1)  # one scale per output unit
    assert v.std().item() == pytest.approx(math.sqrt((1 - dropout) / n_in), rel=0.02)
    assert v.mean().abs().item() < 0.05 * v.std().item()
    assert torch.count_nonzero(layer.bias) == 0
    torch.testing.assert_close(layer.weight, v)  # g starts at the row norms: the effective weight is v
    with torch.no_grad():
        g.mul_(3.0)
    torch.testing.assert_close(layer.weight.norm(dim=1, keepdim=True), g)


@pytest.mark.parametrize("kernel,dropout", [(3, 0.1), (1, 0.0)])
def test_glu_conv_init_and_weight_norm(kernel, dropout):
    torch.manual_seed(0)
    n_in, n_out = 256, 1024
    conv = glu_conv1d(n_in, n_out, kernel, dropout)
    g, v = _weight_norm_parts(conv)
    assert g.shape == (n_out, 1, 1)
    assert v.std().item() == pytest.approx(math.sqrt(4 * (1 - dropout) / (kernel * n_in)), rel=0.02)
    assert torch.count_nonzero(conv.bias) == 0
    torch.testing.assert_close(conv.weight, v)


def test_model_normalizes_every_layer_and_embeds_with_std_0_1():
    m = ConvS2S(2000, 2000, PAD, encoder=dict(embed_dim=64, layers=[[64, 3], [96, 3]]),
                decoder=dict(embed_dim=64, layers=[[64, 3], [96, 3]]), dropout=0.1)
    layers = [mod for mod in m.modules() if isinstance(mod, (torch.nn.Linear, torch.nn.Conv1d))]
    assert len(layers) > 10 and all(parametrize.is_parametrized(mod, "weight") for mod in layers)
    embeddings = [m.encoder.embed_tokens, m.decoder.embed_tokens, m.encoder.embed_positions.weights,
                  m.decoder.embed_positions.weights]
    for emb in embeddings:
        assert emb.weight[PAD].abs().max() == 0
        assert emb.weight.std().item() == pytest.approx(0.1, rel=0.05)
    # the conv after dropout uses p, the attention projections (no dropout in front) do not
    conv_v = _weight_norm_parts(m.decoder.blocks[0].conv.conv)[1]
    assert conv_v.std().item() == pytest.approx(math.sqrt(4 * 0.9 / (3 * 64)), rel=0.05)
    att_v = _weight_norm_parts(m.decoder.blocks[0].attention.in_projection)[1]
    assert att_v.std().item() == pytest.approx(math.sqrt(1 / 64), rel=0.05)


def test_tied_output_uses_the_decoder_embedding():
    kw = dict(share_all_embeddings=True, share_decoder_input_output_embed=True,
              decoder=dict(embed_dim=8, out_embed_dim=8, layers=DEC_LAYERS, attention=True))
    m = tiny(**kw)
    assert m.encoder.embed_tokens.weight is m.decoder.embed_tokens.weight and m.output_projection is None
    src, prev = batch()
    unseen = sorted(set(range(4, V)) - set(src.flatten().tolist()) - set(prev.flatten().tolist()))[0]
    m(src, prev)[..., unseen].sum().backward()  # this row can only get a gradient as an output embedding
    assert m.decoder.embed_tokens.weight.grad[unseen].abs().max() > 0
    for settings in (tiny_settings(), tiny_settings(**kw)):
        defaults = dict(share_all_embeddings=False, share_decoder_input_output_embed=False,
                        max_source_positions=1024, max_target_positions=1024)
        expected = expected_parameters(OmegaConf.create({**defaults, **settings}), V)
        assert count_parameters(ConvS2S(V, V, PAD, **settings)) == expected


# --- configuration errors ---------------------------------------------------------------------------------
@pytest.mark.parametrize("layers,message", [
    ([[8]], "expected \\[width, kernel\\]"),
    ([[8, 3, 1, 1]], "expected \\[width, kernel\\]"),
    ([[8, 0]], "must be >= 1"),
    ([[8, 3], [8, 3, 3]], "lookback must be in 0..2"),
    ([], "is empty"),
])
def test_bad_layer_specs_are_named(layers, message):
    with pytest.raises(SeqmixError, match=message):
        parse_layers(layers, "model.encoder")


@pytest.mark.parametrize("kw,message", [
    (dict(decoder=dict(embed_dim=8, layers=[[8, 3]], attention=[True, True])), "2 entries for 1 decoder layers"),
    (dict(decoder=dict(embed_dim=8, layers=[[8, 3]], attention=False)), "at least one decoder layer"),
    (dict(decoder=dict(embed_dim=6, layers=[[8, 3]])), "must equal model.decoder.embed_dim"),
    (dict(decoder=dict(embed_dim=8, out_embed_dim=6, layers=[[8, 3]]), share_decoder_input_output_embed=True),
     "out_embed_dim"),
    (dict(decoder=dict(embed_dim=8, layers=[[8, 3]], heads=2)), "unknown model.decoder settings"),
])
def test_bad_model_settings_are_named(kw, message):
    with pytest.raises(SeqmixError, match=message):
        tiny(**kw)


# --- presets ------------------------------------------------------------------------------------------------
def expected_parameters(cfg, vocab: int) -> int:
    """Parameters of a ConvS2S config counted from its layer specs (weight-norm g: one per output unit)."""
    enc, dec = cfg.encoder, cfg.decoder
    embed = enc.embed_dim
    out_embed = dec.get("out_embed_dim", dec.embed_dim)

    def lin(n_in, n_out):
        return n_in * n_out + 2 * n_out  # weight, bias, g

    def stack(layers, max_positions, attention, out_dim):
        layers = parse_layers(layers, "test")
        n = (max_positions + PAD + 1) * embed + lin(embed, layers[0].width)
        widths = [layers[0].width]
        for i, spec in enumerate(layers):
            n += widths[-1] * 2 * spec.width * spec.kernel + 2 * (2 * spec.width)  # conv weight, bias, g
            if spec.lookback and widths[-spec.lookback] != spec.width:
                n += lin(widths[-spec.lookback], spec.width)
            if attention[i]:
                n += lin(spec.width, embed) + lin(embed, spec.width)
            widths.append(spec.width)
        return n + lin(widths[-1], out_dim)

    attention = dec.get("attention", True)
    attention = [attention] * len(dec.layers) if isinstance(attention, bool) else list(attention)
    tables = 1 if cfg.share_all_embeddings else 2
    output = vocab if cfg.share_decoder_input_output_embed else lin(out_embed, vocab)
    return (tables * vocab * embed + output
            + stack(enc.layers, cfg.max_source_positions, [False] * len(enc.layers), embed)
            + stack(dec.layers, cfg.max_target_positions, attention, out_embed))


@pytest.mark.parametrize("experiment,vocab,layers", [
    ("gehring2017_convs2s_wmt_ende", 40000, 15),
    ("gehring2017_convs2s_wmt_ende", 32768, 15),
    ("gehring2017_convs2s_wmt_enfr", 40000, 15),
    ("gehring2017_convs2s_wmt16_enro", 40000, 20),
    ("gehring2017_convs2s_iwslt14_deen", 10000, 3),
    ("multi30k_convs2s_cpu", 8000, 4),
])
def test_presets_compose_and_instantiate_with_their_parameter_counts(experiment, vocab, layers):
    from seqmix.config.build import build_model

    cfg = resolve_outside_hydra(compose_train([f"experiment={experiment}", f"task.vocab_size={vocab}"]))
    with torch.device("meta"):  # shapes only: the WMT models have 10^8 parameters
        model = build_model(cfg, vocab, padding_idx=PAD)
    n = count_parameters(model)
    print(f"{experiment} (vocab {vocab}): {n:,} parameters")
    assert isinstance(model, ConvS2S) and len(model.decoder.blocks) == layers
    assert n == expected_parameters(cfg.model, vocab)
    if experiment != "multi30k_convs2s_cpu":
        assert cfg.optim._target_ == "torch.optim.SGD" and cfg.optim.nesterov and cfg.optim.momentum == 0.99
        assert cfg.optim.lr == 0.25 and cfg.trainer.gradient_clip_val == 0.1
        assert cfg.scheduler._target_.endswith("reduce_on_plateau") and cfg.scheduler.factor == 0.1
        assert cfg.label_smoothing == 0.0


def test_wmt_ende_stack_is_fairseqs_registered_one():
    cfg = compose_train(["experiment=gehring2017_convs2s_wmt_ende"])
    specs = parse_layers(cfg.model.encoder.layers, "encoder")
    assert [(s.width, s.kernel) for s in specs] == [(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2
    assert cfg.model.decoder.layers == cfg.model.encoder.layers
    assert cfg.model.encoder.embed_dim == 768 and cfg.model.decoder.out_embed_dim == 512


# --- a few real training steps ------------------------------------------------------------------------------
def test_tiny_model_learns_real_multi30k_batches_with_the_papers_optimizer(multi30k_dir, tmp_path):
    from seqmix.data import LocalParallelSource, TranslationDataModule
    from seqmix.tasks.losses import label_smoothed_nll_loss

    dm = TranslationDataModule(
        LocalParallelSource(str(multi30k_dir), "en", "de"), "en", "de",
        splits={"train": "val", "valid": "val", "test": None},
        tokenizer={"vocab_size": 1000, "lowercase": False, "min_frequency": 2, "joint": True},
        max_tokens=600, cache_dir=str(tmp_path),
    )
    dm.setup("fit")
    loader = iter(dm.dataloader("train"))
    batches = [next(loader) for _ in range(3)]
    tok = dm.tokenizer
    torch.manual_seed(0)
    model = ConvS2S(tok.vocab_size, tok.vocab_size, tok.pad, encoder=dict(embed_dim=32, layers=[[32, 3]] * 2),
                    decoder=dict(embed_dim=32, layers=[[32, 3]] * 2), dropout=0.1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.25, momentum=0.99, nesterov=True)
    loss_fn = functools.partial(label_smoothed_nll_loss, epsilon=0.0, ignore_index=tok.pad)

    def mean_loss() -> float:
        model.eval()
        with torch.no_grad():
            per_token = [loss_fn(model(b["src_tokens"], b["prev_output_tokens"]), b["target"]) for b in batches]
        model.train()
        return sum(loss.item() / n for loss, _, n in per_token) / len(per_token)

    before = mean_loss()
    for _ in range(8):
        for b in batches:
            loss, _, ntok = loss_fn(model(b["src_tokens"], b["prev_output_tokens"]), b["target"])
            optimizer.zero_grad()
            (loss / ntok).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
            optimizer.step()
    after = mean_loss()
    assert math.isfinite(after) and after < before - 0.5, (before, after)
