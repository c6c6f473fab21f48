"""Mask-predict, parallel easy-first and the length beam, step by step on a tiny fixed (scripted) model whose
predictions depend on what each position observes, so every pass can be checked by hand."""

from __future__ import annotations

import math

import pytest
import torch

from seqmix.errors import SeqmixError
from seqmix.generation.nat_decoding import IterativeDecoder, candidate_rows, length_candidates, max_and_argmax
from seqmix.generation.options import NATOptions
from seqmix.models.encoder_decoder import EncoderOut

BOS, PAD, EOS, UNK = 0, 1, 2, 3
V = 10
A, B, C, D = 4, 5, 6, 7  # words


def length_logits(*lengths: int) -> torch.Tensor:
    """Lengths in order of preference (first = most likely)."""
    logits = torch.full((16,), -10.0, dtype=torch.float64)
    for rank, n in enumerate(lengths):
        logits[n] = -float(rank)
    logits[0] = float("-inf")
    return logits


class Scripted:
    """Per source, a rule ``rule(n, seen: dict position -> token, N) -> (token, probability)``.

    Records the observed sets it was called with (per row, per query) for step-by-step checks."""

    eos, padding_idx, unk, bos = EOS, PAD, UNK, BOS
    max_target_positions = 15

    def __init__(self, rules, lengths, per_query=True):
        self.rules, self.lengths, self.per_query_contexts = rules, lengths, per_query
        self.calls: list[dict] = []

    def banned_tokens(self):
        return [BOS, PAD, EOS]

    def encode(self, src_tokens):
        b = src_tokens.size(0)
        out = torch.arange(b, dtype=torch.float64).view(b, 1, 1)  # the source id travels with the rows
        return EncoderOut(out, torch.zeros(b, 1, dtype=torch.bool)), torch.stack([self.lengths[i] for i in range(b)])

    def predict(self, tokens, encoder_out, observed, queries=None):
        """Rows (R, T) with a source each, or groups (S, g, T) of g rows per source whose ``queries`` index the
        g * T slots (as ``DisCoTransformer.predict``); ``seen`` is recorded per candidate row."""
        grouped = tokens.dim() == 3
        if not grouped:
            tokens, observed = tokens.unsqueeze(1), observed.unsqueeze(1)
        units, g, t = tokens.shape
        if observed.dim() == 3:
            observed = observed.unsqueeze(2).expand(units, g, t, t)
        real = tokens.ne(PAD) & tokens.ne(EOS)
        if queries is None:
            queries = torch.arange(g * t).expand(units, g * t)
        logits = torch.full((units, queries.size(1), V), 0.0, dtype=torch.float64)
        call = {"rows": units * g, "seen": []}
        for u in range(units):
            src = int(encoder_out.out[u, 0, 0])
            seen_rows = [[] for _ in range(g)]
            for slot, q in enumerate(queries[u].tolist()):
                r, n = divmod(q, t)
                n_real = int(real[u, r].sum())
                if n >= n_real:
                    continue
                seen = {m: int(tokens[u, r, m]) for m in range(n_real) if observed[u, r, n, m]}
                if q not in queries[u, :slot].tolist():
                    seen_rows[r].append(set(seen))
                tok, p = self.rules[src](n, {m: w for m, w in seen.items() if m != n}, n_real)
                row = torch.full((V,), math.log((1 - p) / (V - 1)), dtype=torch.float64)
                row[tok] = math.log(p)
                logits[u, slot] = row
            call["seen"].extend(seen_rows)
        self.calls.append(call)
        return logits


def chain_rule(n, seen, n_real):
    """Hand-checked case (the target is A B C): position 0 is sure of A; position 1 says B once it sees A at 0,
    else D; position 2 says C once it sees B at 1, else A."""
    if n == 0:
        return A, 0.9
    if n == 1:
        return (B, 0.8) if seen.get(0) == A else (D, 0.6)
    return (C, 0.7) if seen.get(1) == B else (A, 0.4)


def constant_rule(n, seen, n_real):
    return (A + n % 4, 0.5 + 0.1 * (n % 3))


def decode(algorithm, rules, lengths, beam=1, iterations=10, per_query=True):
    model = Scripted(rules, lengths, per_query)
    result = IterativeDecoder(NATOptions(algorithm, beam, iterations)).generate(model, torch.zeros(len(rules), 3), trace=True)
    return model, result


def test_easy_first_step_by_step():
    model, res = decode("easy_first", [chain_rule], [length_logits(4)])
    passes = [h[0][0, :3].tolist() for h in res.history]
    # pass 1 sees only eos: A D A (confidences .9 .6 .4 fix the order 0, 1, 2)
    # pass 2: 0 sees nothing -> A; 1 sees A -> B; 2 sees A, D -> A.  pass 3: 2 sees A, B -> C.  pass 4: unchanged
    assert passes == [[A, D, A], [A, B, A], [A, B, C], [A, B, C]]
    # only stale positions are recomputed: pass 2 skips position 0 (it observes nothing new), pass 3 only
    # recomputes 2 (the one observing the changed position 1), pass 4 nothing (nobody observes position 2)
    assert [c["seen"][0] for c in model.calls] == [[set(), set(), set()], [{0}, {0, 1}], [{0, 1}]]
    assert res.tokens[0].tolist() == [A, B, C] and res.iterations.tolist() == [4]
    assert res.scores[0].item() == pytest.approx((math.log(0.9) + math.log(0.8) + math.log(0.7)) / 3)


def test_easy_first_stops_at_max_iterations():
    _, res = decode("easy_first", [chain_rule], [length_logits(4)], iterations=2)
    assert res.tokens[0].tolist() == [A, B, A] and res.iterations.tolist() == [2] and len(res.history) == 2
    _, res = decode("easy_first", [chain_rule], [length_logits(4)], iterations=1)
    assert res.tokens[0].tolist() == [A, D, A] and res.iterations.tolist() == [1]


def test_easy_first_early_stop_per_source_and_finished_sources_leave_the_batch():
    model, res = decode("easy_first", [constant_rule, chain_rule], [length_logits(5), length_logits(4)])
    assert res.iterations.tolist() == [2, 4]  # the constant source converges at its first refinement
    assert [c["rows"] for c in model.calls] == [2, 2, 1]  # pass 4 of the chain source has nothing stale
    assert res.tokens[1].tolist() == [A, B, C]


def test_easy_first_stops_on_the_best_candidate_only():
    # length 3 (two tokens, constant, p .3) converges at pass 2 but never scores best; length 4 (the chain) does
    def rule(n, seen, n_real):
        return chain_rule(n, seen, n_real) if n_real == 3 else (A, 0.3)

    _, res = decode("easy_first", [rule], [length_logits(3, 4)], beam=2)
    assert res.iterations.tolist() == [4] and res.tokens[0].tolist() == [A, B, C]


def test_mask_predict_step_by_step():
    model, res = decode("mask_predict", [chain_rule], [length_logits(4)], iterations=3, per_query=False)
    passes = [h[0][0, :3].tolist() for h in res.history]
    probs = [h[1][0, :3].exp().tolist() for h in res.history]
    # pass 1: all masked -> A D A (.9 .6 .4); t=1 re-masks max(1, 3*2//3) = 2 least probable (1, 2), both see {0}:
    # 1 -> B (.8), 2 -> A (.4); t=2 re-masks max(1, 3*1//3) = 1 (position 2), which sees {0, 1} -> C (.7)
    assert passes == [[A, D, A], [A, B, A], [A, B, C]]
    assert probs[1] == pytest.approx([0.9, 0.8, 0.4]) and probs[2] == pytest.approx([0.9, 0.8, 0.7])
    seen = [c["seen"][0] for c in model.calls]
    assert seen[1][1:] == [{0}, {0}] and seen[2][2] == {0, 1}
    assert res.tokens[0].tolist() == [A, B, C] and res.iterations.tolist() == [3]


@pytest.mark.parametrize("n_real,iterations,expected", [
    (10, 4, [7, 5, 2]), (2, 4, [1, 1, 1]), (5, 10, [4, 4, 3, 3, 2, 2, 1, 1, 1]), (3, 1, []),
])
def test_mask_predict_remasks_floor_n_times_remaining_over_t(n_real, iterations, expected):
    model, res = decode("mask_predict", [constant_rule], [length_logits(n_real + 1)], iterations=iterations,
                        per_query=False)
    # a masked position is the one no query observes in that pass
    masked = [sum(1 for m in range(n_real) if not any(m in seen for seen in c["seen"][0])) for c in model.calls[1:]]
    assert masked == expected and res.iterations.tolist() == [iterations] and len(model.calls) == iterations


def test_length_beam_picks_by_mean_log_probability():
    # lengths 2 (one token, p .7) is the likeliest, 4 (three tokens, p .8 each) next: the sum of log-probs
    # prefers length 2 (-0.36 vs -0.67) but the mean prefers length 4 (-0.22)
    def rule(n, seen, n_real):
        return (A, 0.7) if n_real == 1 else (B, 0.8)

    for algorithm, per_query in (("easy_first", True), ("mask_predict", False)):
        _, res = decode(algorithm, [rule], [length_logits(2, 4, 3)], beam=2, iterations=2, per_query=per_query)
        assert res.tokens[0].tolist() == [B, B, B], algorithm
        assert res.scores[0].item() == pytest.approx(math.log(0.8))
        _, res = decode(algorithm, [rule], [length_logits(2, 4, 3)], beam=1, iterations=2, per_query=per_query)
        assert res.tokens[0].tolist() == [A], algorithm


def test_length_candidates_and_rows():
    logits = torch.stack([length_logits(1, 5, 3), length_logits(4, 2, 6)])
    lengths = length_candidates(logits, 3)
    assert lengths.tolist() == [[2, 5, 3], [4, 2, 6]]  # length 1 (eos alone) clamps to 2
    logits = torch.stack([length_logits(1, 5, 3, 4, 2), length_logits(4, 2, 6, 3, 1)])
    capped = length_candidates(logits, 3, max_length=torch.tensor([4, 3]))
    assert capped.tolist() == [[2, 3, 4], [2, 3, 2]]  # lengths above the cap never compete
    rows = candidate_rows(torch.tensor([[3, 1 + 1]]), UNK, EOS, PAD)
    assert rows.tolist() == [[UNK, UNK, EOS], [UNK, EOS, PAD]]


def test_easy_first_needs_per_query_contexts():
    with pytest.raises(SeqmixError, match="model=disco"):
        decode("easy_first", [chain_rule], [length_logits(4)], per_query=False)
    with pytest.raises(SeqmixError, match="algorithm='beam' is unknown"):
        NATOptions("beam")


@pytest.mark.parametrize("vocab", [5, 64, 200, 8000])
def test_max_and_argmax_equals_max_over_the_vocabulary(vocab):
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, 7, vocab, generator=gen, dtype=torch.float64)
    logits[..., :3] = float("-inf")  # banned symbols
    logits[0, 0, :] = float("-inf")
    logits[0, 0, vocab - 1] = 0.0  # the only finite entry is the last one (in the tail when vocab % 64)
    logits[1, 2, 0] = 50.0  # the first entry
    value, index = max_and_argmax(logits)
    expected_value, expected_index = logits.max(dim=-1)
    assert torch.equal(value, expected_value) and torch.equal(index, expected_index)
    assert index[0, 0] == vocab - 1 and index[1, 2] == 0
