"""generate.py's decoding options of issue 36: output_format=jsonl / fairseq hold what the task's decode_outputs (the
Python API's path) gives, nbest=1 writes today's text file, prefix_size forces the reference's start, a language
model given decoding options continues its lines, and requests that do not fit end in one `seqmix: error:` line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from seqmix.config.build import load_task
from seqmix.data.tokenizer import train_word_tokenizer
from seqmix.generation.options import DecodeRequest, SamplingOptions
from tests.helpers import ROOT, TINY_LM, TINY_TRANSFORMER, describe, random_checkpoint, run

pytestmark = pytest.mark.slow

TINY_MODEL, LM_MODEL = TINY_TRANSFORMER, TINY_LM
SOURCES = ["a b c", "d e f g h", "h a"]
REFERENCES = ["c b a", "h g f e d", "a h"]


def save(folder, name: str, overrides: list[str], seed: int) -> str:
    tokenizer = train_word_tokenizer(["a b c d e f g h", "h g f e d c b a"] * 20, 40)
    return random_checkpoint(folder / f"{name}.ckpt", overrides, tokenizer, seed)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    folder = tmp_path_factory.mktemp("outputs")
    (folder / "in.txt").write_text("".join(s + "\n" for s in SOURCES))
    (folder / "ref.txt").write_text("".join(r + "\n" for r in REFERENCES))
    return folder, save(folder, "mt", TINY_MODEL, 0), save(folder, "lm", LM_MODEL, 1)


def generate(folder, name: str, *args: str, code: int = 0):
    out = folder / f"{name}.out"
    proc = run("generate.py", [f"input={folder / 'in.txt'}", f"output={out}", *args], folder / name)
    assert proc.returncode == code, describe(proc)
    return proc, out


def test_jsonl_and_fairseq_hold_the_nbest_lists_of_decode_outputs(made):
    folder, mt, _ = made
    _, text = generate(folder, "text", f"ckpt_path={mt}", "beam_size=3")
    _, one = generate(folder, "one", f"ckpt_path={mt}", "beam_size=3", "nbest=1", "output_format=text")
    _, jsonl = generate(folder, "jsonl", f"ckpt_path={mt}", "beam_size=3", "nbest=3", "output_format=jsonl",
                        f"reference={folder / 'ref.txt'}")
    _, fair = generate(folder, "fairseq", f"ckpt_path={mt}", "beam_size=3", "nbest=3", "output_format=fairseq",
                       f"reference={folder / 'ref.txt'}")
    task, _ = load_task(mt)
    want, _ = task.decode_outputs(SOURCES, None, request=DecodeRequest(nbest=3), beam_size=3)
    assert one.read_text() == text.read_text() == "".join(hyps[0].text + "\n" for hyps in want)
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    assert [(r["id"], r["source"], r["reference"]) for r in records] == list(zip(range(3), SOURCES, REFERENCES))
    for record, hyps in zip(records, want):
        assert [h["text"] for h in record["hypotheses"]] == [h.text for h in hyps]
        assert [h["score"] for h in record["hypotheses"]] == pytest.approx([h.score for h in hyps], abs=1e-6)
        for got, h in zip(record["hypotheses"], hyps):
            assert got["positional_scores"] == pytest.approx(h.positional_scores, abs=1e-6)
    lines = fair.read_text().splitlines()
    for i, (source, ref, hyps) in enumerate(zip(SOURCES, REFERENCES, want)):
        mine = [line.split("\t") for line in lines if line.split("\t")[0].endswith(f"-{i}")]
        assert mine[0] == [f"S-{i}", source] and mine[1] == [f"T-{i}", ref]
        assert [m[0][0] for m in mine[2:]] == list("HDP" * 3)
        for (h, d, p), hyp in zip(zip(mine[2::3], mine[3::3], mine[4::3]), hyps):
            assert float(h[1]) == pytest.approx(hyp.score, abs=1e-5) and h[2] == " ".join(hyp.pieces)
            assert d[2] == hyp.text and float(d[1]) == float(h[1])
            assert [float(x) for x in p[1].split()] == pytest.approx(hyp.positional_scores, abs=1e-4)


def test_sampling_and_prefix_size_from_the_command_line(made):
    folder, mt, _ = made
    _, greedy = generate(folder, "greedy", f"ckpt_path={mt}", "beam_size=1")
    _, top1 = generate(folder, "top1", f"ckpt_path={mt}", "sampling=true", "top_k=1", "seed=3")
    assert top1.read_text() == greedy.read_text()
    _, a = generate(folder, "a", f"ckpt_path={mt}", "sampling=true", "seed=3", "nbest=2", "output_format=jsonl")
    _, b = generate(folder, "b", f"ckpt_path={mt}", "sampling=true", "seed=3", "nbest=2", "output_format=jsonl")
    assert a.read_text() == b.read_text()
    task, _ = load_task(mt)
    want, _ = task.decode_outputs(SOURCES, None, request=DecodeRequest(2, SamplingOptions(seed=3)))
    assert [[h["text"] for h in json.loads(line)["hypotheses"]] for line in a.read_text().splitlines()] == \
        [[h.text for h in hyps] for hyps in want]
    _, forced = generate(folder, "forced", f"ckpt_path={mt}", "prefix_size=2", f"reference={folder / 'ref.txt'}",
                         "output_format=jsonl")
    for line, ref in zip(forced.read_text().splitlines(), REFERENCES):
        assert json.loads(line)["hypotheses"][0]["text"].split()[:2] == ref.split()[:2]
    _, zero = generate(folder, "zero", f"ckpt_path={mt}", "prefix_size=0", f"reference={folder / 'ref.txt'}")
    _, plain = generate(folder, "plain", f"ckpt_path={mt}")
    assert zero.read_text() == plain.read_text()


def test_a_language_model_continues_its_lines_given_decoding_options(made):
    folder, _, lm = made
    proc, out = generate(folder, "ppl", f"ckpt_path={lm}")
    assert "perplexity" in proc.stdout and not out.exists()
    proc, out = generate(folder, "cont", f"ckpt_path={lm}", "beam_size=1", "max_len_b=4")
    assert "continuation by beam search" in proc.stdout
    task, _ = load_task(lm)
    want, _ = task.decode_outputs(SOURCES, None, beam_size=1, max_len_b=4)
    lines = out.read_text().splitlines()
    assert lines == [hyps[0].text for hyps in want]
    assert all(line.startswith(source) for line, source in zip(lines, SOURCES))
    _, sampled = generate(folder, "lm_sampled", f"ckpt_path={lm}", "sampling=true", "top_k=1", "max_len_b=4")
    assert sampled.read_text() == out.read_text()
    env = {**os.environ, "SEQMIX_LOG_DIR": str(folder / "stdin"), "PYTHONUNBUFFERED": "1"}
    typed = subprocess.run([sys.executable, str(ROOT / "generate.py"), f"ckpt_path={lm}", "input=-", "beam_size=1",
                            "max_len_b=4"], input="".join(s + "\n" for s in SOURCES), capture_output=True, text=True,
                           env=env, cwd=folder, timeout=300)
    assert typed.returncode == 0 and typed.stdout.splitlines() == lines, typed.stderr[-3000:]


@pytest.mark.parametrize("args, needle", [
    (["nbest=4", "beam_size=2"], "nbest=4 is more than the beam keeps (beam_size=2)"),
    (["sampling=true", "beam_size=4"], "sampling=true draws samples instead of a beam search: drop beam_size=4"),
    (["top_k=5"], "top_k shape sampling: add sampling=true"),
    (["prefix_size=2"], "prefix_size=2 forces the first tokens of each reference, and there are none"),
    (["sampling=true", "top_p=1.5"], "top_p=1.5: must be a finite number > 0 and <= 1"),
    (["sampling=true", "temperature=0"], "temperature=0: must be a finite number > 0"),
    (["nbest=0"], "nbest=0: must be a whole number >= 1"),
    (["output_format=csv"], "output_format='csv': must be one of ['text', 'jsonl', 'fairseq']"),
    (["score_reference=true", "nbest=2", "beam_size=2"], "score_reference=true scores the references"),
])
def test_requests_that_do_not_fit_end_in_one_line(made, args, needle):
    folder, mt, _ = made
    proc, out = generate(folder, "bad", f"ckpt_path={mt}", *args, code=2)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("seqmix: error:")]
    assert len(errors) == 1 and needle in errors[0], describe(proc)
    assert "Traceback" not in proc.stderr + proc.stdout and not out.exists()
