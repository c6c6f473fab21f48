"""A sentence's outputs do not depend on what it is batched with: alone == in a right-padded batch beside a longer
neighbour (pads on its source and target side), to 1e-12 in float64, for every model family (the encoder-decoder
with each mixer of the group, a hybrid stack, ConvS2S, the language model, DisCo, CMLM with each mixer), for the
teacher-forced pass and every decoding algorithm (beam search, greedy, mask-predict and easy-first with a length
beam). Tiny random models in eval mode."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seqmix.config.mixer_group import mixer_factory, mixer_names
from seqmix.errors import SeqmixError
from seqmix.generation.beam_search import BeamSearch
from seqmix.generation.nat_decoding import IterativeDecoder
from seqmix.generation.options import ALGORITHMS, NATOptions
from seqmix.models import DecoderOnly, EncoderDecoder
from seqmix.models.disco_attention import DisCoAttention
from seqmix.models.nat import CMLMTransformer, DisCoTransformer
from tests.mixers.test_mixers import TEST_CONF
from tests.models import test_convs2s, test_hybrid, test_nat

PAD, BOS, EOS, V = 1, 0, 2, 40
EXACT = dict(rtol=0, atol=1e-12)
GROUP = mixer_names([TEST_CONF])


def side(mixer: str, **kw) -> dict:
    """A two-layer stack of one group mixer, as a config builds it (the file's kernel sizes, the stack's heads)."""
    return dict(layers=2, ffn_dim=32, heads=2, mixer=mixer_factory(mixer, [TEST_CONF]), **kw)


def encoder_decoder(mixer: str) -> EncoderDecoder:
    torch.manual_seed(0)
    return EncoderDecoder(V, V, PAD, 16, encoder=side(mixer), decoder=side(mixer, cross_attention_heads=2),
                          dropout=0.0).double().eval()


def larger_weights(model: torch.nn.Module) -> torch.nn.Module:
    """N(0, 0.3) weights: a tiny NAT model's predictions then depend on the observed tokens (several passes)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    return model


def cmlm(mixer: str) -> CMLMTransformer:
    torch.manual_seed(0)
    model = CMLMTransformer(V, V, PAD, embed_dim=16, dropout=0.1, max_source_positions=32, max_target_positions=32,
                            encoder=side(mixer), decoder=side(mixer, cross_attention_heads=2))
    return larger_weights(model.double().eval())


AUTOREGRESSIVE = {
    **{f"transformer-{m}": (lambda m=m: encoder_decoder(m)) for m in GROUP},
    "hybrid": lambda: test_hybrid.hybrid("DTA").double(),
    "convs2s": test_convs2s.tiny,
}
NON_AUTOREGRESSIVE = {
    **{f"cmlm-{m}": (lambda m=m: cmlm(m)) for m in GROUP},
    "disco": lambda: larger_weights(test_nat.tiny(DisCoTransformer, DisCoAttention)),
}


def right_pad(rows: list[torch.Tensor]) -> torch.Tensor:
    width = max(r.size(-1) for r in rows)
    return torch.stack([F.pad(r, (0, width - r.size(-1)), value=PAD) for r in rows])


def sentence_pair(seed: int, src_len: int = 5, tgt_len: int = 4, longer: int = 4):
    """(source, target) of one sentence (1, S) / (1, T) and of a longer neighbour; each source ends in eos."""
    gen = torch.Generator().manual_seed(seed)
    src, other_src = (torch.randint(4, V, (n,), generator=gen) for n in (src_len, src_len + longer))
    src[-1] = other_src[-1] = EOS
    tgt, other_tgt = (torch.randint(4, V, (n,), generator=gen) for n in (tgt_len, tgt_len + longer))
    return src, tgt, other_src, other_tgt


def batched(src, other_src):
    """The sentence alone (1, S) and as row 1 of a right-padded batch behind its neighbour."""
    return src.unsqueeze(0), right_pad([other_src, src])


# --- the teacher-forced pass ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(AUTOREGRESSIVE))
def test_teacher_forced_pass_alone_equals_in_a_padded_batch(name):
    model = AUTOREGRESSIVE[name]()
    src, tgt, other_src, other_tgt = sentence_pair(1)
    prev = torch.cat([torch.tensor([BOS]), tgt])
    other_prev = torch.cat([torch.tensor([BOS]), other_tgt])
    src1, src2 = batched(src, other_src)
    prev1, prev2 = batched(prev, other_prev)
    assert src2[1].eq(PAD).any() and prev2[1].eq(PAD).any()
    with torch.no_grad():
        alone, together = model(src1, prev1), model(src2, prev2)
    torch.testing.assert_close(together[1, : prev.numel()], alone[0], **EXACT)


@pytest.mark.parametrize("mixer", GROUP)
def test_language_model_alone_equals_in_a_padded_batch(mixer):
    torch.manual_seed(0)
    lm = DecoderOnly(V, PAD, 16, side(mixer, normalize_before=True), dropout=0.0,
                     input_cutoffs=(10, 20), softmax_cutoffs=(10, 20)).double().eval()
    _, tokens, _, other = sentence_pair(2, tgt_len=6)
    one, two = batched(tokens, other)
    with torch.no_grad():
        alone, together = lm(one), lm(two)
        torch.testing.assert_close(together[1, : tokens.numel()], alone[0], **EXACT)
        torch.testing.assert_close(lm.log_probs(together)[1, : tokens.numel()], lm.log_probs(alone)[0], **EXACT)


def nat_target_and_context(model, tgt: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The target with its eos (1, T) and a training context for it: (1, T) for CMLM, (1, T, T) for DisCo."""
    target = torch.cat([tgt, torch.tensor([EOS])]).unsqueeze(0)
    observed, _ = model.training_context(target, gen)
    return target, observed


@pytest.mark.parametrize("name", sorted(NON_AUTOREGRESSIVE))
def test_nat_pass_alone_equals_in_a_padded_batch(name):
    model = NON_AUTOREGRESSIVE[name]()
    src, tgt, other_src, other_tgt = sentence_pair(3)
    gen = torch.Generator().manual_seed(3)
    target, observed = nat_target_and_context(model, tgt, gen)
    other_target, other_observed = nat_target_and_context(model, other_tgt, gen)
    width = other_target.size(1)
    pad = width - target.size(1)
    targets = torch.cat([other_target, F.pad(target, (0, pad), value=PAD)])
    contexts = torch.cat([other_observed, F.pad(observed, (0, pad) * (observed.dim() - 1), value=False)])
    src1, src2 = batched(src, other_src)
    with torch.no_grad():
        enc1, lengths1 = model.encode(src1)
        enc2, lengths2 = model.encode(src2)
        torch.testing.assert_close(lengths2[1], lengths1[0], **EXACT)
        torch.testing.assert_close(enc2.out[1, : src.numel()], enc1.out[0], **EXACT)
        alone, together = model.predict(target, enc1, observed), model.predict(targets, enc2, contexts)
    torch.testing.assert_close(together[1, : target.size(1)], alone[0], **EXACT)


# --- decoding ---------------------------------------------------------------------------------------------------
def same_hypotheses(alone, together) -> None:
    assert [h.tokens.tolist() for h in together] == [h.tokens.tolist() for h in alone]
    for a, b in zip(alone, together):
        assert abs(a.score - b.score) <= 1e-12
        torch.testing.assert_close(b.positional_scores, a.positional_scores, **EXACT)


@pytest.mark.parametrize("beam", [1, 4], ids=["greedy", "beam4"])
@pytest.mark.parametrize("name", sorted(AUTOREGRESSIVE))
def test_beam_search_alone_equals_in_a_padded_batch(name, beam):
    model = AUTOREGRESSIVE[name]()
    src, _, other_src, _ = sentence_pair(4)
    src1, src2 = batched(src, other_src)
    search = BeamSearch(BOS, EOS, PAD, beam_size=beam, max_len_a=1.0, max_len_b=2)
    alone, together = search.generate(model, src1), search.generate(model, src2)
    same_hypotheses(alone[0], together[1])


def nat_algorithms(name: str) -> list[tuple[str, str]]:
    model = NON_AUTOREGRESSIVE[name]()
    out = []
    for algorithm in ALGORITHMS:
        try:
            NATOptions(algorithm).for_model(model)
        except SeqmixError:  # easy-first needs per-query contexts (DisCo)
            continue
        out.append((name, algorithm))
    return out


@pytest.mark.parametrize("name,algorithm", [c for n in sorted(NON_AUTOREGRESSIVE) for c in nat_algorithms(n)])
def test_nat_decoding_alone_equals_in_a_padded_batch(name, algorithm):
    model = NON_AUTOREGRESSIVE[name]()
    src, _, other_src, _ = sentence_pair(5, src_len=4, longer=6)
    src1, src2 = batched(src, other_src)
    k = 5  # length beam: the neighbour's longest candidate is then longer than the sentence's
    decoder = IterativeDecoder(NATOptions(algorithm, length_beam=k, max_iterations=4), max_len_a=1.0, max_len_b=2)
    alone, together = decoder.generate(model, src1, trace=True), decoder.generate(model, src2, trace=True)
    assert together.history[0][0].size(1) > alone.history[0][0].size(1), "the sentence's candidates get no pads"
    assert together.tokens[1].tolist() == alone.tokens[0].tolist()
    assert together.iterations[1] == alone.iterations[0]
    torch.testing.assert_close(together.scores[1], alone.scores[0], **EXACT)
    for (tokens1, logp1), (tokens2, logp2) in zip(alone.history, together.history):  # every pass the sentence ran
        t = tokens1.size(1)
        assert tokens2[k: 2 * k, :t].tolist() == tokens1.tolist() and tokens2[k: 2 * k, t:].eq(PAD).all()
        torch.testing.assert_close(logp2[k: 2 * k, :t], logp1, **EXACT)
