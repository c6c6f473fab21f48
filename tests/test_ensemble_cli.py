"""``generate.py ckpt_path=[a.ckpt,b.ckpt]`` decodes with the ensemble of the checkpoints' models and
``score_reference=true`` scores references instead of decoding (issue 36, item 2): what the commands write equals
what the same ensemble gives in Python; checkpoints of another vocabulary or task, NAT checkpoints and average_last
with an ensemble are refused in one line naming the checkpoints."""

from __future__ import annotations

import math

import pytest
import torch

from seqmix.config.build import load_task
from seqmix.config.ensemble import load_checkpoints
from seqmix.data.tokenizer import train_tokenizer
from seqmix.errors import SeqmixError
from seqmix.generation.ensemble import Ensemble
from tests.helpers import TINY_TRANSFORMER, describe, random_checkpoint, run

TINY_MODEL = TINY_TRANSFORMER
TEXTS = ["a b c d e f g h", "h g f e d c b a"] * 20
SOURCES = ["a b c", "d e f g h", "h a"]
REFERENCES = ["c b a", "h g f e d", "a h"]


def save(folder, name: str, seed: int, tokenizer, overrides=()) -> str:
    return random_checkpoint(folder / f"{name}.ckpt", [*TINY_MODEL, *overrides], tokenizer, seed, std=1.0,
                             seed_first=True)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Two models of one task and vocabulary (other weights), one with another vocabulary, one NAT model."""
    folder = tmp_path_factory.mktemp("ensemble")
    tokenizer = train_tokenizer(TEXTS, vocab_size=40)
    paths = {"a": save(folder, "a", 0, tokenizer), "b": save(folder, "b", 1, tokenizer),
             "other_vocab": save(folder, "other_vocab", 2, train_tokenizer(TEXTS + ["x y z"] * 5, vocab_size=44)),
             "nat": save(folder, "nat", 3, tokenizer, ["model=cmlm", "model.max_source_positions=32",
                                                       "model.max_target_positions=32"])}
    (folder / "in.txt").write_text("\n".join(SOURCES) + "\n")
    (folder / "ref.txt").write_text("\n".join(REFERENCES) + "\n")
    return folder, paths


def python_ensemble(paths: dict):
    """The ensemble built by hand from the two checkpoints loaded one by one."""
    task, _ = load_task(paths["a"])
    task.model = Ensemble([task.model, load_task(paths["b"])[0].model]).eval()
    return task


@pytest.mark.parametrize("pair", [("a", "other_vocab"), ("other_vocab", "a")])
def test_another_vocabulary_is_refused_in_one_line_naming_both(ckpts, pair):
    _, paths = ckpts
    with pytest.raises(SeqmixError) as err:
        load_checkpoints([paths[pair[0]], paths[pair[1]]])
    message = str(err.value)
    assert "\n" not in message and "vocabularies differ" in message
    assert paths[pair[0]] in message and paths[pair[1]] in message


def test_nat_checkpoints_and_average_last_are_refused(ckpts):
    _, paths = ckpts
    with pytest.raises(SeqmixError, match="non-autoregressive"):
        load_checkpoints([paths["a"], paths["nat"]])
    with pytest.raises(SeqmixError, match="average_last= averages the checkpoints of one run"):
        load_checkpoints([paths["a"], paths["b"]], average_last=2)


def test_a_list_loads_the_first_task_around_an_ensemble_of_all(ckpts):
    _, paths = ckpts
    task, cfg = load_checkpoints([paths["a"], paths["b"]])
    assert isinstance(task.model, Ensemble) and len(task.model.models) == 2
    hand = python_ensemble(paths)
    for got, expected in zip(task.model.state_dict().values(), hand.model.state_dict().values()):
        assert torch.equal(got, expected)
    single, _ = load_checkpoints([paths["a"]])  # a list of one is the checkpoint itself
    assert not isinstance(single.model, Ensemble)


def generate(folder, name: str, *args: str):
    proc = run("generate.py", [f"input={folder / 'in.txt'}", f"output={folder / name}.txt", *args], folder / name)
    return proc, folder / f"{name}.txt"


@pytest.mark.slow
def test_generate_decodes_with_the_ensemble(ckpts):
    folder, paths = ckpts
    proc, out = generate(folder, "decoded", f"ckpt_path=[{paths['a']},{paths['b']}]", "beam_size=3")
    assert proc.returncode == 0, describe(proc)
    assert "ensemble of 2 checkpoints" in proc.stdout and f"decoding settings from {paths['a']}" in proc.stdout
    expected, _ = python_ensemble(paths).evaluate_texts(SOURCES, None, 8000, beam_size=3)
    alone, _ = load_task(paths["a"])[0].evaluate_texts(SOURCES, None, 8000, beam_size=3)
    assert out.read_text().splitlines() == expected
    assert expected != alone and len(set(expected)) == len(SOURCES)


@pytest.mark.slow
def test_score_reference_writes_the_ensemble_scores_of_the_references(ckpts):
    folder, paths = ckpts
    proc, out = generate(folder, "scored", f"ckpt_path=[{paths['a']},{paths['b']}]", "score_reference=true",
                         f"reference={folder / 'ref.txt'}", "len_penalty=0.6")
    assert proc.returncode == 0, describe(proc)
    corpus = python_ensemble(paths).score_texts(SOURCES, REFERENCES, len_penalty=0.6)
    lines = [line.split("\t") for line in out.read_text().splitlines()]
    assert [text for _, _, text in lines] == REFERENCES
    for (score, positional, _), expected in zip(lines, corpus.sentences):
        assert float(score) == pytest.approx(expected.score, abs=1e-6)
        per_token = [float(x) for x in positional.split()]
        assert per_token == pytest.approx(expected.positional_scores.tolist(), abs=1e-4)
        assert expected.score == pytest.approx(sum(per_token) / len(per_token) ** 0.6, abs=1e-3)
    ntokens = sum(len(s.positional_scores) for s in corpus.sentences)
    mean = sum(float(s.positional_scores.double().sum()) for s in corpus.sentences) / ntokens
    assert f"mean log-prob {mean:.4f} nats per token, perplexity {math.exp(-mean):.2f}" in proc.stdout


@pytest.mark.slow
def test_the_commands_refuse_a_mismatch_and_scoring_without_references(ckpts):
    folder, paths = ckpts
    proc, _ = generate(folder, "mismatch", f"ckpt_path=[{paths['a']},{paths['other_vocab']}]")
    assert proc.returncode == 2, describe(proc)
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("seqmix: error:")]
    assert f"cannot ensemble {paths['a']} and {paths['other_vocab']}" in line and "Traceback" not in proc.stderr
    proc, _ = generate(folder, "noref", f"ckpt_path={paths['a']}", "score_reference=true")
    assert proc.returncode == 2 and "seqmix: error: score_reference=true needs references" in proc.stderr, \
        describe(proc)


@pytest.mark.slow
def test_score_reference_scores_a_language_models_input_lines(ckpts):
    folder, _ = ckpts
    tokenizer = train_tokenizer(TEXTS, vocab_size=40)
    lm = save(folder, "lm", 5, tokenizer, ["task=wikitext2", "task.data.break_mode=eos"])
    proc, out = generate(folder, "lm_scored", f"ckpt_path={lm}", "score_reference=true")
    assert proc.returncode == 0, describe(proc)
    task, _ = load_task(lm)
    corpus = task.score_texts(SOURCES)
    _, report = task.evaluate_texts(SOURCES)  # break_mode=eos: each line its own sample, as scored here
    lines = [line.split("\t") for line in out.read_text().splitlines()]
    assert [text for _, _, text in lines] == SOURCES
    assert [float(score) for score, _, _ in lines] == pytest.approx([s.score for s in corpus.sentences], abs=1e-6)
    (printed,) = [float(x.rsplit("perplexity ", 1)[1]) for x in proc.stdout.splitlines() if x.startswith("scored ")]
    assert printed == pytest.approx(report.score, rel=1e-5) and corpus.perplexity == pytest.approx(report.score,
                                                                                                   rel=1e-5)
