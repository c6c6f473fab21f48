"""``seqmix.load``: a checkpoint in Python decodes, summarizes and scores exactly as ``generate.py`` does from the same
file; averages of listed files equal the written average; devices and dtypes move the model; calls that do not fit
the model end in one SeqmixError."""

from __future__ import annotations

import math

import pytest
import torch

import seqmix
from seqmix.config.build import build_task
from seqmix.data.tokenizer import train_tokenizer, train_word_tokenizer
from seqmix.errors import SeqmixError
from seqmix.interop.fairseq import save_seqmix_checkpoint
from seqmix.training.checkpoints import write_averaged
from tests.helpers import TINY_LM, TINY_TRANSFORMER, describe, run, run_config
from tests.helpers import random_checkpoint as random_checkpoint_of

TINY, LM_TINY = TINY_TRANSFORMER, TINY_LM
TEXTS = ["a b c d", "h g f", "c c a b e"]


def tokenizer():
    return train_tokenizer(["a b c d e f g h", "h g f e d c b a"] * 20, vocab_size=40)


def random_checkpoint(path, overrides, seed: int):
    return random_checkpoint_of(path, overrides, tokenizer(), seed)


@pytest.fixture(scope="module")
def translation_ckpts(tmp_path_factory):
    folder = tmp_path_factory.mktemp("api")
    return [random_checkpoint(folder / f"m{i}.ckpt", TINY, i) for i in range(2)]


@pytest.fixture(scope="module")
def lm_ckpt(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("lm") / "lm.ckpt", LM_TINY, 3)


@pytest.mark.slow
def test_translate_gives_what_generate_py_writes_from_the_same_checkpoint(translation_ckpts, tmp_path):
    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in TEXTS))
    proc = run("generate.py", [f"ckpt_path={translation_ckpts[0]}", f"input={tmp_path / 'in.txt'}",
                               f"output={tmp_path / 'out.txt'}", "beam_size=3"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    model = seqmix.load(translation_ckpts[0])
    assert model.translate(TEXTS, beam_size=3) == (tmp_path / "out.txt").read_text().splitlines()
    assert model.translate(TEXTS[1], beam_size=3) == model.translate(TEXTS, beam_size=3)[1]
    assert "beam_size=3" in model.settings(beam_size=3)


def test_small_token_budgets_batch_inside_and_change_nothing(translation_ckpts):
    model = seqmix.load(translation_ckpts[1])
    assert model.translate(TEXTS * 3, max_tokens=8) == model.translate(TEXTS * 3)


def test_an_average_of_listed_files_equals_the_written_average(translation_ckpts, tmp_path):
    write_averaged(translation_ckpts, tmp_path / "avg.ckpt")
    listed = seqmix.load(average=translation_ckpts)
    written = seqmix.load(tmp_path / "avg.ckpt")
    for (name, a), (_, b) in zip(listed.task.model.state_dict().items(), written.task.model.state_dict().items()):
        assert torch.equal(a, b), name
    assert listed.translate(TEXTS) == written.translate(TEXTS)
    assert listed.translate(TEXTS) != seqmix.load(translation_ckpts[1]).translate(TEXTS)


def test_an_ensemble_of_one_checkpoint_twice_translates_and_scores_as_the_checkpoint(translation_ckpts):
    alone, twice = seqmix.load(translation_ckpts[0]), seqmix.load([translation_ckpts[0]] * 2)
    hyps = alone.translate(TEXTS)
    assert twice.translate(TEXTS) == hyps
    for a, b in zip(alone.score(TEXTS, hyps).sentences, twice.score(TEXTS, hyps).sentences):
        assert b.score == pytest.approx(a.score, abs=1e-5)
        assert torch.allclose(a.positional_scores, b.positional_scores, atol=1e-5)


def test_scores_are_the_teacher_forced_log_probs_of_each_target(translation_ckpts):
    model = seqmix.load(translation_ckpts[1]).to(torch.float64)
    net, tok = model.task.model, model.tokenizer
    corpus = model.score(TEXTS, ["b c", "a", "h h g"], len_penalty=1.0)
    for source, target, scored in zip(TEXTS, ["b c", "a", "h h g"], corpus.sentences):
        src = torch.tensor([tok.encode_batch([source])[0] + [tok.eos]])
        tgt = tok.encode_target_batch([target])[0] + [tok.eos]
        hand = []
        for t in range(len(tgt)):  # the whole prefix again at every step: no incremental state
            prefix = torch.tensor([[model.task.decoder_start, *tgt[:t]]])
            logits = net(src, prefix)
            logits = logits[0] if isinstance(logits, tuple) else logits
            hand.append(float(torch.log_softmax(logits[0, -1].double(), -1)[tgt[t]]))
        assert scored.positional_scores.tolist() == pytest.approx(hand, abs=1e-9)
        assert scored.score == pytest.approx(sum(hand) / len(hand), abs=1e-9)
    assert corpus.ntokens == sum(len(s.positional_scores) for s in corpus.sentences)


def test_to_and_half_move_the_weights_and_double_precision_decodes_the_same(translation_ckpts):
    model = seqmix.load(translation_ckpts[0])
    single = model.translate(TEXTS)
    assert model.to(torch.float64) is model
    assert {p.dtype for p in model.task.model.parameters()} == {torch.float64}
    assert model.translate(TEXTS) == single
    assert next(model.half().task.model.parameters()).dtype == torch.float16
    assert model.device == torch.device("cpu") and "transformer_small" in repr(model)


def test_quantize_decodes_with_int8_linears_and_scores_close_to_float32(translation_ckpts):
    from seqmix.models.quantized import quantized_linears

    model = seqmix.load(translation_ckpts[0])
    hyps = model.translate(TEXTS)
    full = model.score(TEXTS, hyps)
    assert model.quantize() is model and quantized_linears(model.task.model) > 0
    quantized = model.score(TEXTS, hyps)
    for a, b in zip(full.sentences, quantized.sentences):
        assert a.score != b.score and b.score == pytest.approx(a.score, abs=0.1)
    assert all(isinstance(h, str) for h in model.translate(TEXTS))
    with pytest.raises(SeqmixError, match="unknown"):
        seqmix.load(translation_ckpts[0]).quantize("int4")


def test_a_fairseq_export_loads_as_the_model_it_came_from(translation_ckpts, tmp_path):
    from seqmix.interop.fairseq import export_checkpoint

    original = seqmix.load(translation_ckpts[1])
    export_checkpoint(translation_ckpts[1], tmp_path / "fs")
    for model in (seqmix.load(tmp_path / "fs"), seqmix.load_fairseq(tmp_path / "fs" / "checkpoint.pt")):
        assert model.translate(TEXTS, beam_size=3) == original.translate(TEXTS, beam_size=3)
        for a, b in zip(original.score(TEXTS, TEXTS).sentences, model.score(TEXTS, TEXTS).sentences):
            assert torch.allclose(a.positional_scores, b.positional_scores, atol=1e-5)
    lm = random_checkpoint(tmp_path / "lm.ckpt", [*LM_TINY, "model.decoder.normalize_before=true"], 4)
    export_checkpoint(lm, tmp_path / "lm")
    assert seqmix.load(tmp_path / "lm").perplexity(TEXTS) == pytest.approx(seqmix.load(lm).perplexity(TEXTS), rel=1e-5)
    with pytest.raises(SeqmixError, match="does not exist"):
        seqmix.load(tmp_path)  # a folder without checkpoint.pt


def test_perplexity_is_the_exponent_of_the_mean_next_token_loss(lm_ckpt):
    model = seqmix.load(lm_ckpt)
    tok, net = model.tokenizer, model.task.model
    ids = tok.encode_batch(["a b c d"])[0]
    tokens = torch.tensor([[tok.eos, *ids]])
    target = [*ids, tok.eos]
    with torch.no_grad():
        logp = net.log_probs(net(tokens)).double()[0]
    nll = -sum(float(logp[t, y]) for t, y in enumerate(target)) / len(target)
    assert model.perplexity("a b c d") == pytest.approx(math.exp(nll), rel=1e-5)


@pytest.mark.parametrize("call, needle", [
    (lambda m, lm: m.perplexity(TEXTS), "not a language model"),
    (lambda m, lm: m.summarize(TEXTS), "not a summarization model"),
    (lambda m, lm: lm.translate(TEXTS), "language model"),
    (lambda m, lm: m.translate([1, 2]), "list of strings"),
    (lambda m, lm: m.score(TEXTS, TEXTS[:2]), "3 sources but 2 targets"),
    (lambda m, lm: m.score(TEXTS), "score.sources, targets"),
    (lambda m, lm: lm.score(TEXTS, TEXTS), "takes the texts alone"),
    (lambda m, lm: seqmix.load("no/such.ckpt"), "does not exist"),
    (lambda m, lm: seqmix.load(), "give a checkpoint"),
    (lambda m, lm: seqmix.load(lm_ckpt, average=[lm_ckpt]), "not both"),
])
def test_calls_that_do_not_fit_the_model_are_one_error(call, needle, translation_ckpts, lm_ckpt):
    with pytest.raises(SeqmixError, match=needle):
        call(seqmix.load(translation_ckpts[0]), seqmix.load(lm_ckpt))


# --- n-best lists and sampling (issue 36): the same decode_outputs as generate.py ------------------------------------
@pytest.fixture(scope="module")
def word_ckpt(tmp_path_factory):
    """A translation model over a word vocabulary: a hypothesis's text encodes back to its own tokens, so
    Model.score can rescore it exactly."""
    task = build_task(run_config(TINY), train_word_tokenizer(["a b c d e f g h", "h g f e d c b a"] * 20, 40))
    torch.manual_seed(5)
    for p in task.model.parameters():
        p.data.normal_(0, 0.5)
    path = tmp_path_factory.mktemp("words") / "w.ckpt"
    save_seqmix_checkpoint(path, task)
    return path


def test_nbest_1_is_translate_and_the_nbest_list_starts_with_it(translation_ckpts):
    model = seqmix.load(translation_ckpts[0])
    best = model.translate(TEXTS, beam_size=4)
    one = model.translate(TEXTS, beam_size=4, with_scores=True)
    four = model.translate(TEXTS, beam_size=4, nbest=4)
    assert [hyps[0].text for hyps in one] == best == [hyps[0].text for hyps in four]
    assert all(len(h) == 1 for h in one) and all(len(h) == 4 for h in four)
    for hyps in four:
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({h.text for h in hyps}) == 4
    assert model.translate(TEXTS[0], beam_size=4, nbest=2)[0].text == best[0]


@pytest.mark.parametrize("len_penalty", [1.0, 0.6])
def test_nbest_scores_are_what_score_gives_the_hypotheses(word_ckpt, len_penalty):
    model = seqmix.load(word_ckpt)
    nbest = model.translate(TEXTS, beam_size=3, nbest=3, len_penalty=len_penalty)
    for source, hyps in zip(TEXTS, nbest):
        scored = model.score([source] * len(hyps), [h.text for h in hyps], len_penalty=len_penalty)
        for h, s in zip(hyps, scored.sentences):
            assert h.score == pytest.approx(s.score, abs=1e-5)
            assert h.positional_scores == pytest.approx(s.positional_scores.tolist(), abs=1e-5)


def test_sampling_with_top_k_1_is_greedy_translation_and_a_seed_repeats_samples(translation_ckpts):
    model = seqmix.load(translation_ckpts[1])
    assert model.sample(TEXTS, top_k=1) == model.translate(TEXTS, beam_size=1)
    a = model.sample(TEXTS, seed=7, nbest=3, temperature=1.5)
    assert a == model.sample(TEXTS, seed=7, nbest=3, temperature=1.5)
    assert a != model.sample(TEXTS, seed=8, nbest=3, temperature=1.5)
    assert all(len(samples) == 3 for samples in a)


def test_sample_scores_are_what_score_gives_the_samples(word_ckpt):
    model = seqmix.load(word_ckpt)
    samples = model.sample(TEXTS, seed=1, nbest=2, top_p=0.9)
    for source, hyps in zip(TEXTS, samples):
        scored = model.score([source] * len(hyps), [h.text for h in hyps])
        assert [h.score for h in hyps] == pytest.approx([s.score for s in scored.sentences], abs=1e-5)


def test_a_language_model_samples_continuations_of_prompts(lm_ckpt):
    model = seqmix.load(lm_ckpt)
    prompts = ["a b", "c d e"]
    greedy, _ = model.task.decode_outputs(prompts, None, beam_size=1, max_len_b=5)
    assert model.sample(prompts, top_k=1, max_len_b=5) == [hyps[0].text for hyps in greedy]
    samples = model.sample(prompts, seed=3, nbest=2, max_len_b=5, with_scores=True)
    assert samples == model.sample(prompts, seed=3, nbest=2, max_len_b=5, with_scores=True)
    for prompt, hyps in zip(prompts, samples):
        for h in hyps:
            assert h.text.startswith(prompt) and 2 <= len(h.positional_scores) <= 6
            assert h.score == pytest.approx(sum(h.positional_scores) / len(h.positional_scores), abs=1e-6)


@pytest.mark.parametrize("call, needle", [
    (lambda m: m.translate(TEXTS, beam_size=2, nbest=3), "nbest=3 is more than the beam keeps"),
    (lambda m: m.translate(TEXTS, nbest=0), "nbest=0 must be"),
    (lambda m: m.sample(TEXTS, beam_size=4), "drop beam_size=4"),
    (lambda m: m.sample(TEXTS, top_p=0), r"top_p=0 must be in \(0, 1\]"),
    (lambda m: m.sample(TEXTS, top_k=-1), "top_k=-1"),
    (lambda m: m.sample(TEXTS, temperature=0), "temperature=0"),
])
def test_decoding_requests_that_do_not_fit_are_one_error(call, needle, translation_ckpts):
    with pytest.raises(SeqmixError, match=needle):
        call(seqmix.load(translation_ckpts[0]))
