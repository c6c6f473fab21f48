"""DisCo / CMLM backbones: disentangled contexts, length prediction, the CMLM mask symbol (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from seqmix.mixers.self_attention import SelfAttention
from seqmix.models.disco_attention import DisCoAttention, single_visible_key
from seqmix.models.nat import CMLMTransformer, DisCoTransformer
from seqmix.models.nat_masks import disco_observed

PAD, EOS, V = 1, 2, 40


def tiny(cls, decoder_mixer, layers: int = 2):
    torch.manual_seed(0)
    settings = dict(layers=layers, ffn_dim=32, activation="gelu")
    model = cls(V, V, PAD, embed_dim=16, dropout=0.1, max_source_positions=32, max_target_positions=32,
                encoder={**settings, "mixer": lambda **kw: SelfAttention(num_heads=2, **kw)},
                decoder={**settings, "cross_attention_heads": 2,
                         "mixer": lambda **kw: decoder_mixer(num_heads=2, **kw)})
    return model.double().eval()


def sample_target(gen) -> torch.Tensor:
    target = torch.randint(4, V, (3, 9), generator=gen)
    target[0, 8] = EOS
    target[1, 5], target[1, 6:] = EOS, PAD
    target[2, 2], target[2, 3:] = EOS, PAD
    return target


def disco_case(seed: int):
    """A 3-layer tiny DisCo, a padded batch of targets with random DisCo training contexts, and its encoding."""
    model = tiny(DisCoTransformer, DisCoAttention, layers=3)
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (3, 7), generator=gen)
    target = sample_target(gen)
    observed = disco_observed(target, PAD, EOS, gen)
    enc, _ = model.encode(src)
    return model, target, observed, enc


def naive_disco_attention(mixer, x, context, observed):
    """Kasai et al. 2020 §3: query n attends to the projected embeddings of its observed tokens only; one query
    and one head at a time (float64)."""
    attn = mixer.attn
    d = attn.head_dim
    out = torch.zeros_like(x)
    for b in range(x.size(0)):
        for n in range(x.size(1)):
            seen = context[b, observed[b, n]]
            q, k, v = attn.q_proj(x[b, n]), attn.k_proj(seen), attn.v_proj(seen)
            heads = []
            for h in range(attn.num_heads):
                part = slice(h * d, (h + 1) * d)
                weights = torch.softmax(k[:, part] @ q[part] / math.sqrt(d), dim=0)
                heads.append(weights @ v[:, part])
            out[b, n] = attn.out_proj(torch.cat(heads))
    return out


@pytest.mark.parametrize("one_key_each", [False, True])
def test_disco_attention_equals_a_per_query_loop(one_key_each):
    # one visible key per query (decoding's first pass: eos alone) takes a shortcut: that key's value, no scores
    torch.manual_seed(1)
    mixer = DisCoAttention(16, num_heads=2).double().eval()
    with torch.no_grad():
        for p in mixer.parameters():
            p.normal_(0, 0.3)
    x, context = torch.randn(2, 7, 16, dtype=torch.double), torch.randn(2, 7, 16, dtype=torch.double)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    if one_key_each:
        observed = torch.nn.functional.one_hot(torch.randint(0, 5, (2, 7)), 7).bool()
    else:
        observed = (torch.rand(2, 7, 7) < 0.5) & ~pad.unsqueeze(1)
        observed[..., 4] = True
    assert (single_visible_key(observed, pad) is not None) == one_key_each
    got = mixer(x, key_padding_mask=pad, context=context, observed=observed)
    torch.testing.assert_close(got, naive_disco_attention(mixer, x, context, observed), rtol=0, atol=1e-10)


def test_disco_query_output_ignores_tokens_outside_its_observed_set():
    model, target, observed, enc = disco_case(3)
    base = model.predict(target, enc, observed)
    real = target.ne(PAD) & target.ne(EOS)
    checked = changed = 0
    for b, n in real.nonzero().tolist():
        hidden = real[b] & ~observed[b, n]  # includes n itself
        other = target.clone()
        other[b, hidden] = 4 + (other[b, hidden] - 3) % (V - 4)  # different real tokens
        assert hidden[n] and not torch.equal(other, target)
        out = model.predict(other, enc, observed)
        torch.testing.assert_close(out[b, n], base[b, n], rtol=0, atol=1e-12)
        checked += 1
        seen = (real[b] & observed[b, n]).nonzero().flatten()
        if seen.numel():  # and a visible token does matter (so the check above can fail)
            other = target.clone()
            other[b, seen[0]] = 4 + (other[b, seen[0]] - 3) % (V - 4)
            changed += int((model.predict(other, enc, observed)[b, n] - base[b, n]).abs().max() > 1e-6)
    assert checked == int(real.sum()) and changed > 0


def test_disco_training_context_scores_every_real_token_and_shared_sets_exclude_self():
    model = tiny(DisCoTransformer, DisCoAttention)
    target = sample_target(torch.Generator().manual_seed(0))
    observed, scored = model.training_context(target)
    assert torch.equal(scored, target.ne(PAD) & target.ne(EOS))
    shared = model.per_query_observed(target, torch.ones_like(target, dtype=torch.bool))
    assert not torch.diagonal(shared, dim1=1, dim2=2)[scored].any()
    assert shared[:, :, 8][0].all() and shared[1, :, 5].all()  # eos visible to every query


def test_length_logits_and_targets():
    model = tiny(DisCoTransformer, DisCoAttention)
    src = torch.tensor([[5, 6, 7, EOS], [8, EOS, PAD, PAD]])
    _, logits = model.encode(src)
    assert logits.shape == (2, 33) and torch.isneginf(logits[:, 0]).all() and torch.isfinite(logits[:, 1:]).all()
    assert model.length_targets(torch.tensor([[5, 6, EOS, PAD], [5, 6, 7, EOS]])).tolist() == [3, 4]
    # the LENGTH token is part of the encoder: source padding does not change the prediction
    _, padded = model.encode(torch.tensor([[8, EOS, PAD, PAD, PAD, PAD]]))
    torch.testing.assert_close(padded[0, 1:], logits[1, 1:], rtol=0, atol=1e-12)


def test_cmlm_hides_unobserved_tokens_behind_the_mask_symbol():
    model = tiny(CMLMTransformer, SelfAttention)
    assert model.vocab_size == V + 1 and model.mask_idx == V and model.mask_idx in model.banned_tokens()
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, V, (3, 7), generator=gen)
    target = sample_target(gen)
    known, scored = model.training_context(target)
    assert torch.equal(known, ~scored) and scored.any()
    enc, _ = model.encode(src)
    base = model.predict(target, enc, known)
    other = target.clone()
    other[scored] = 4 + (other[scored] - 3) % (V - 4)
    torch.testing.assert_close(model.predict(other, enc, known), base, rtol=0, atol=1e-12)
    visible = known & target.ne(PAD) & target.ne(EOS)
    other = target.clone()
    other[visible] = 4 + (other[visible] - 3) % (V - 4)
    assert (model.predict(other, enc, known) - base).abs().max() > 1e-6
    with pytest.raises(ValueError, match="model=disco"):
        model.predict(target, enc, known.unsqueeze(1).expand(-1, 9, -1))


def test_init_is_normal_002_and_embeddings_are_tied():
    model = tiny(DisCoTransformer, DisCoAttention)
    w = model.decoder.layers[0].mixer.attn.k_proj.weight.detach()
    assert abs(float(w.std()) - 0.02) < 0.005 and float(model.decoder.layers[0].ffn.fc1.bias.detach().abs().max()) == 0
    assert model.encoder.embed_tokens is model.decoder.embed_tokens is model.embed_tokens
    assert float(model.embed_tokens.weight.detach()[PAD].abs().max()) == 0


def test_disco_predict_on_a_query_subset_or_with_cached_cross_attention_equals_the_full_pass():
    model, target, observed, enc = disco_case(5)
    full = model.predict(target, enc, observed)
    queries = torch.tensor([[6, 0, 3], [4, 4, 1], [1, 0, 0]])  # any order, repeats allowed
    part = model.predict(target, enc, observed, queries=queries)
    assert part.shape == (3, 3, V)
    torch.testing.assert_close(part, full.gather(1, queries.unsqueeze(-1).expand(-1, -1, V)), rtol=0, atol=1e-12)
    # the cross-attention cache (projected once, carried through index_select) changes nothing
    rows = torch.tensor([2, 0, 2])
    cached = model.with_cross_cache(enc).index_select(rows)
    assert cached.cross_kv is not None and len(cached.cross_kv) == 3
    again = model.predict(target[rows], cached, observed[rows])
    torch.testing.assert_close(again, full[rows], rtol=0, atol=1e-12)


def test_disco_predict_on_groups_of_candidate_rows_equals_the_rows_one_by_one():
    # grouped: the g rows of a source share one pass (g * T keys, each query masked to its own row)
    model, target, observed, enc = disco_case(6)
    pick = torch.tensor([[0, 1], [1, 2], [2, 0]])  # source s holds rows pick[s]: different lengths and padding
    rows, contexts = target[pick.reshape(-1)], observed[pick.reshape(-1)]
    one_by_one = model.predict(rows, enc.index_select(torch.arange(3).repeat_interleave(2)), contexts)
    grouped = model.predict(rows.view(3, 2, 9), enc, contexts.view(3, 2, 9, 9))
    torch.testing.assert_close(grouped, one_by_one.reshape(3, 18, V), rtol=0, atol=1e-12)
    queries = torch.tensor([[12, 3, 0, 9], [17, 5, 5, 10], [1, 2, 11, 16]])  # slot = row * 9 + position
    part = model.predict(rows.view(3, 2, 9), model.with_cross_cache(enc), contexts.view(3, 2, 9, 9), queries)
    expected = one_by_one.reshape(3, 18, V).gather(1, queries.unsqueeze(-1).expand(-1, -1, V))
    torch.testing.assert_close(part, expected, rtol=0, atol=1e-12)


def reference_easy_first(model, src, lengths, max_iterations):
    """Kasai et al. 2020 Alg. 1 written plainly: one source and one candidate at a time, every real position
    recomputed in every pass; returns (chosen tokens, iterations, tokens of every candidate after every pass)."""
    banned = model.banned_tokens()

    def best_tokens(row, enc, observed):
        lprobs = torch.log_softmax(model.predict(row, enc, observed)[0], dim=-1)
        lprobs[:, banned] = float("-inf")
        return lprobs.max(dim=-1)

    chosen, iterations, passes = [], [], []
    for b in range(src.size(0)):
        enc, _ = model.encode(src[b : b + 1])
        cands = []
        for length in lengths[b].tolist():
            n = length - 1
            row = torch.tensor([[model.unk] * n + [EOS]])
            logp, tok = best_tokens(row, enc, torch.zeros(1, length, length, dtype=torch.bool))
            row[0, :n] = tok[:n]
            rank = torch.argsort(torch.argsort(-logp[:n], stable=True))
            observed = torch.zeros(1, length, length, dtype=torch.bool)
            for q in range(n):
                for m in range(n):
                    observed[0, q, m] = bool(rank[m] < rank[q])
            cands.append({"row": row, "logp": logp[:n], "observed": observed, "n": n})
        history = [[c["row"][0, : c["n"]].clone() for c in cands]]
        done_at = max_iterations
        best = max(range(len(cands)), key=lambda i: cands[i]["logp"].mean().item())
        for t in range(2, max_iterations + 1):
            previous = [c["row"].clone() for c in cands]
            for c in cands:
                logp, tok = best_tokens(c["row"], enc, c["observed"])
                c["row"] = c["row"].clone()
                c["row"][0, : c["n"]] = tok[: c["n"]]
                c["logp"] = logp[: c["n"]]
            history.append([c["row"][0, : c["n"]].clone() for c in cands])
            best = max(range(len(cands)), key=lambda i: cands[i]["logp"].mean().item())
            if torch.equal(cands[best]["row"], previous[best]):
                done_at = t
                break
        chosen.append(cands[best]["row"][0, : cands[best]["n"]])
        iterations.append(done_at)
        passes.append(history)
    return chosen, iterations, passes


@pytest.mark.parametrize("seed", [0, 2])
def test_easy_first_on_a_real_disco_equals_the_plain_algorithm(seed):
    from seqmix.generation.nat_decoding import easy_first

    model = tiny(DisCoTransformer, DisCoAttention, layers=2)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # weights large enough that predictions depend on the context (several passes)
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)
    src = torch.randint(4, V, (4, 6), generator=gen)
    src[1, 4:], src[3, 2:] = PAD, PAD
    src[torch.arange(4), torch.tensor([5, 3, 5, 1])] = EOS
    lengths = torch.tensor([[2, 6, 4], [9, 5, 7], [5, 8, 3], [7, 4, 6]])  # padded rows, a one-token candidate
    with torch.no_grad():
        enc, _ = model.encode(src)
        res = easy_first(model, enc, lengths, max_iterations=6, trace=True)
        chosen, iterations, passes = reference_easy_first(model, src, lengths, 6)
    assert res.iterations.tolist() == iterations and max(iterations) >= 3
    assert [t.tolist() for t in res.tokens] == [t.tolist() for t in chosen]
    k = lengths.size(1)
    for b, history in enumerate(passes):  # every candidate after every pass that source ran
        for t, cands in enumerate(history):
            for i, tokens in enumerate(cands):
                assert res.history[t][0][b * k + i, : tokens.numel()].tolist() == tokens.tolist(), (b, t, i)
