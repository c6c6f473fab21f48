"""Adaptive input and adaptive softmax: proper distributions, tied weights, the no-cutoff case is a full softmax."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from seqmix.errors import SeqmixError
from seqmix.models import AdaptiveInput, AdaptiveSoftmax, count_parameters

PAD, V, D = 1, 50, 16


def tied(cutoffs, factor=2.0):
    torch.manual_seed(0)
    emb = AdaptiveInput(V, PAD, D, cutoffs, factor)
    return emb, AdaptiveSoftmax(D, V, cutoffs, factor, bands=emb.bands).eval()


@pytest.mark.parametrize("cutoffs", [[], [10], [10, 30]])
def test_log_probs_sum_to_one_and_nll_matches(cutoffs):
    _, head = tied(cutoffs)
    x = torch.randn(3, 7, D, dtype=torch.float64)
    head.double()
    lp = head.log_probs(x)
    assert lp.shape == (3, 7, V)
    assert torch.allclose(lp.exp().sum(-1), torch.ones(3, 7, dtype=torch.float64), atol=1e-12)
    target = torch.arange(21).view(3, 7) * 2 + 2  # every band, and PAD (1) nowhere
    target[0, 0] = PAD
    nll = head.nll(x, target, ignore_index=PAD)
    expect = -lp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    expect[0, 0] = 0.0
    assert torch.allclose(nll, expect, atol=1e-12)


def test_without_cutoffs_it_is_the_tied_full_softmax():
    emb, head = tied([])
    x = torch.randn(4, D)
    full = F.log_softmax(x @ emb.weight.t(), dim=-1)
    assert torch.allclose(head.log_probs(x), full, atol=1e-6)
    tokens = torch.tensor([[2, 7, PAD]])
    assert torch.equal(emb(tokens), F.embedding(tokens, emb.weight))
    assert torch.count_nonzero(emb(torch.tensor([PAD]))) == 0


def test_bands_shrink_by_factor_and_weights_are_shared():
    emb, head = tied([10, 30], factor=4.0)
    assert [b.embed.embedding_dim for b in emb.bands] == [16, 4, 1]
    assert [b.embed.num_embeddings for b in emb.bands] == [10, 20, 20]
    assert emb.bands[0].proj is None and emb.bands[1].proj.weight.shape == (16, 4)
    for b_in, b_out in zip(emb.bands, head.bands):
        assert b_in.embed.weight is b_out.embed.weight
    own = AdaptiveSoftmax(D, V, [10, 30], 4.0)  # untied: its own bands
    module = torch.nn.ModuleList([emb, head])
    assert count_parameters(module) == count_parameters(emb) + head.cluster.weight.numel()
    assert count_parameters(own) == count_parameters(emb) + own.cluster.weight.numel()


def test_adaptive_input_projects_each_band():
    emb, _ = tied([10, 30])
    tokens = torch.tensor([[3, 12, 45]])
    out = emb(tokens)
    b1, b2 = emb.bands[1], emb.bands[2]
    assert torch.allclose(out[0, 0], emb.bands[0].embed.weight[3])
    assert torch.allclose(out[0, 1], b1.proj(b1.embed.weight[12 - 10]))
    assert torch.allclose(out[0, 2], b2.proj(b2.embed.weight[45 - 30]))


def test_gradients_reach_every_band_through_the_tie():
    emb, head = tied([10, 30])
    head.train()
    x = emb(torch.tensor([[2, 15, 40]]))
    head.nll(x, torch.tensor([[15, 40, 3]]), PAD).sum().backward()
    assert all(b.embed.weight.grad is not None and b.embed.weight.grad.abs().sum() > 0 for b in emb.bands)


@pytest.mark.parametrize("cutoffs", [[30, 10], [10, 10], [0], [50]])
def test_bad_cutoffs_name_the_setting(cutoffs):
    with pytest.raises(SeqmixError, match="task.adaptive.cutoffs"):
        AdaptiveInput(V, PAD, D, cutoffs)


def test_tying_needs_the_same_cutoffs():
    emb = AdaptiveInput(V, PAD, D, [10])
    with pytest.raises(SeqmixError, match="same cutoffs"):
        AdaptiveSoftmax(D, V, [10, 30], bands=emb.bands)


@pytest.mark.parametrize("cutoffs,factor", [([10], 2.0), ([10, 30], 4.0), ([5, 20, 40], 2.0)])
def test_log_probs_equal_torch_adaptive_log_softmax_float64(cutoffs, factor):
    """An independent implementation: torch.nn.AdaptiveLogSoftmaxWithLoss given the same weights (head = band 0's
    vectors + the cluster rows; tail i = band i's projection (transposed) then its vectors), in float64."""
    emb, head = tied(cutoffs, factor)
    head.double()
    ref = torch.nn.AdaptiveLogSoftmaxWithLoss(D, V, cutoffs, div_value=factor, head_bias=False).double().eval()
    with torch.no_grad():
        ref.head.weight.copy_(torch.cat([head.bands[0].embed.weight, head.cluster.weight]))
        for tail, band in zip(ref.tail, head.bands[1:]):
            tail[0].weight.copy_(band.proj.weight.t())
            tail[1].weight.copy_(band.embed.weight)
    x = torch.randn(11, D, dtype=torch.float64)
    expect = ref.log_prob(x)
    assert torch.allclose(head.log_probs(x), expect, atol=1e-12, rtol=0)
    target = torch.randint(0, V, (11,))
    target[target == PAD] = 0
    assert torch.allclose(head.nll(x, target, ignore_index=PAD), -ref(x, target).output, atol=1e-12, rtol=0)


def _lm(tie: bool, cutoffs=(10, 30), seed=0):
    from seqmix.mixers import SelfAttention
    from seqmix.models import DecoderOnly

    torch.manual_seed(seed)
    return DecoderOnly(V, PAD, D, dict(layers=1, ffn_dim=32, mixer=functools.partial(SelfAttention, num_heads=2)),
                       dropout=0.0, input_cutoffs=cutoffs, softmax_cutoffs=cutoffs, adaptive_factor=4.0,
                       tie_weights=tie)


def _band_params(module) -> list:
    return [p for b in module.bands for p in ([b.embed.weight] + ([b.proj.weight] if b.proj is not None else []))]


@pytest.mark.parametrize("cutoffs", [(), (10, 30)])
def test_decoder_only_ties_every_band_through_training_and_checkpoints(cutoffs):
    """Tied = the same Parameter objects (vectors and projections): a loss on the softmax alone moves the input
    embedding, the optimizer sees each tensor once, and a state-dict round trip keeps the tie."""
    model = _lm(True, cutoffs)
    inp, out = _band_params(model.decoder.embed_tokens), _band_params(model.output)
    assert len(inp) == len(out) == (1 if not cutoffs else 5) and all(a is b for a, b in zip(inp, out))
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.startswith("output.bands") for n in names)  # listed once, under the input embedding
    before = [p.detach().clone() for p in inp]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    features = torch.randn(4, 6, D)  # not from the embedding: only the tie can move it
    model.nll(features, torch.randint(2, V, (4, 6))).sum().backward()
    opt.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, inp))
    fresh = _lm(True, cutoffs, seed=1)
    fresh.load_state_dict(model.state_dict())
    assert all(a is b for a, b in zip(_band_params(fresh.decoder.embed_tokens), _band_params(fresh.output)))
    with torch.no_grad():
        fresh.decoder.embed_tokens.bands[-1].embed.weight.mul_(2.0)
    assert torch.equal(fresh.output.bands[-1].embed.weight, fresh.decoder.embed_tokens.bands[-1].embed.weight)
    untied = _lm(False, cutoffs)
    assert not any(a is b for a, b in zip(_band_params(untied.decoder.embed_tokens), _band_params(untied.output)))
    assert count_parameters(untied) - count_parameters(model) == sum(p.numel() for p in out)


def test_fairseq_layout_projects_every_band_but_the_head_reads_band_0_as_is():
    """project_all_bands: band 0 gets a d x d projection (fairseq's adaptive input); the head scores band 0's words
    with its vectors alone, so that projection changes the input, never the softmax."""
    torch.manual_seed(0)
    emb = AdaptiveInput(V, PAD, D, [10, 30], 2.0, project_all_bands=True)
    assert all(b.proj is not None for b in emb.bands) and emb.bands[0].proj.weight.shape == (D, D)
    head = AdaptiveSoftmax(D, V, [10, 30], 2.0, bands=emb.bands).eval().double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    before = head.log_probs(x)
    with torch.no_grad():
        emb.bands[0].proj.weight.mul_(3.0)
    assert torch.equal(head.log_probs(x), before)
    assert AdaptiveInput(V, PAD, D, [], 2.0, project_all_bands=True).bands[0].proj is None  # a plain embedding


def test_untied_projections_share_only_the_word_vectors():
    torch.manual_seed(0)
    emb = AdaptiveInput(V, PAD, D, [10, 30], 2.0)
    head = AdaptiveSoftmax(D, V, [10, 30], 2.0, bands=emb.bands, tie_projections=False).eval().double()
    assert head.bands[1].embed is emb.bands[1].embed and head.tail_proj[0].weight is not emb.bands[1].proj.weight
    assert head.tail_proj[0].weight.shape == emb.bands[1].proj.weight.shape
    x = torch.randn(2, 5, D, dtype=torch.float64)
    lp = head.log_probs(x)
    assert torch.allclose(lp.exp().sum(-1), torch.ones(2, 5, dtype=torch.float64), atol=1e-12)
    with torch.no_grad():
        emb.bands[1].proj.weight.mul_(3.0)  # the input's projection: not the softmax's any more
    assert torch.equal(head.log_probs(x), lp)
    with torch.no_grad():
        head.tail_proj[0].weight.mul_(3.0)
    assert not torch.equal(head.log_probs(x)[..., 10:30], lp[..., 10:30])


def test_a_pre_norm_stack_without_final_norm():
    from seqmix.mixers import SelfAttention
    from seqmix.models.decoder_only import DecoderOnly

    decoder = {"layers": 1, "ffn_dim": 8, "heads": 2, "normalize_before": True,
               "mixer": functools.partial(SelfAttention)}
    assert DecoderOnly(V, PAD, D, decoder).decoder.layer_norm is not None  # the default keeps it
    assert DecoderOnly(V, PAD, D, {**decoder, "final_norm": False}).decoder.layer_norm is None


@pytest.mark.parametrize("project_all_bands", [False, True])
@pytest.mark.parametrize("cutoffs", [[], [10, 30]])
def test_under_bf16_autocast_a_batch_s_dtype_and_values_do_not_depend_on_its_words(cutoffs, project_all_bands):
    """The WikiText-2 recipes train bf16-mixed on CPUs with native bf16: band 0 (a plain table) comes out in fp32 and
    a projected band in bf16, and a batch mixing them once failed (and a batch of one band would change dtype)."""
    torch.manual_seed(0)
    emb = AdaptiveInput(V, PAD, D, cutoffs, 2.0, project_all_bands=project_all_bands)
    tokens = torch.tensor([[3, 12, 40, PAD], [45, 35, 20, 11]])  # a row of band 0 and tails, a row of tails only
    with torch.autocast("cpu", dtype=torch.bfloat16):
        batch, alone = emb(tokens), emb(tokens[1:])
        emb(tokens).float().sum().backward()
    assert batch.dtype == alone.dtype == torch.float32
    assert torch.equal(batch[1:], alone)
    with torch.no_grad():
        plain = emb(tokens)
    assert torch.allclose(batch, plain, atol=0.05, rtol=0.02)  # the projections' bf16 rounding only
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in emb.parameters())
