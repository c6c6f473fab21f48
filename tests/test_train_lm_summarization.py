"""End-to-end train.py / generate.py for the language-modeling and summarization tasks (tiny, seconds each)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from tests.helpers import describe, run
from tests.test_train import assert_clean_failure, checkpoints

# Every test reads WikiText-2 or DialogSum from ../shared (skipped without it, a failure in CI).
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("shared_data")]

QUICK = ["logger=csv", "~callbacks.progress_bar", "trainer.max_epochs=1", "trainer.limit_train_batches=4",
         "trainer.limit_val_batches=2", "trainer.limit_test_batches=2", "model.embed_dim=32"]
LM_TINY = [*QUICK, "task=wikitext2", "model.decoder.layers=2", "model.decoder.ffn_dim=64",
           "model.decoder.heads=2", "task.data.tokens_per_sample=64", "task.data.max_tokens=512",
           "task.adaptive.input=true", "task.adaptive.softmax=true", "task.adaptive.cutoffs=[2000,10000]"]
SUM_TINY = [*QUICK, "task=dialogsum", "task.vocab_size=600", "model.encoder.layers=1", "model.decoder.layers=1",
            "model.encoder.ffn_dim=64", "model.decoder.ffn_dim=64", "model.encoder.heads=2",
            "model.decoder.heads=2", "model.decoder.cross_attention_heads=2", "task.data.max_tokens=2048",
            "task.generation.beam_size=2", "task.generation.max_len_b=12"]


def printed(proc, pattern: str) -> re.Match:
    match = re.search(pattern, proc.stdout, re.MULTILINE)
    assert match, describe(proc)
    return match


@pytest.mark.parametrize("model", ["transformer_small", "dynamicconv_small"])
def test_wikitext2_trains_reports_perplexity_and_generate_scores_text(tmp_path, model):
    train = run("train.py", [*LM_TINY, f"model={model}"], tmp_path / "t")
    assert train.returncode == 0, describe(train)
    ppl = float(printed(train, r"^valid perplexity: ([0-9.]+)$").group(1))
    assert 1.0 < ppl < 3 * 33_280  # about uniform over the words after four updates, and finite
    assert "words incl. </s>" in train.stdout
    best = next(p for p in checkpoints(tmp_path / "t") if p.name == "best.ckpt")
    text = tmp_path / "text.txt"
    text.write_text(" the cat sat on the mat . \n = Title = \n\n")
    gen = run("generate.py", [f"ckpt_path={best}", f"input={text}", "eval_context=16"], tmp_path / "g")
    assert gen.returncode == 0, describe(gen)
    assert math.isfinite(float(printed(gen, r"^perplexity: ([0-9.]+)$").group(1)))
    assert "over 13 words incl. </s>" in gen.stdout and "+16 tokens of unscored context" in gen.stdout


def test_dialogsum_trains_reports_rouge_with_lead3_and_generate_decodes(tmp_path):
    # logger=none: the run trains without a logger (the learning-rate monitor, which needs one, is left out)
    no_logger = [a for a in SUM_TINY if a != "logger=csv"] + ["logger=none"]
    train = run("train.py", [*no_logger, "model=lightconv_small", "run_test=true"], tmp_path / "t")
    assert train.returncode == 0, describe(train)
    printed(train, r"^valid ROUGE-1/2/L/Lsum: [0-9.]+/[0-9.]+/[0-9.]+/[0-9.]+$")
    lead = printed(train, r"^lead-3 baseline: ROUGE-1/2/L/Lsum F1 ([0-9.]+)/([0-9.]+)/([0-9.]+)/([0-9.]+) "
                          r"\(rouge-score, stemming on, 500 examples")
    assert 15 < float(lead.group(1)) < 50  # the first turns share words with the summaries
    best = next(p for p in checkpoints(tmp_path / "t") if p.name == "best.ckpt")
    gen = run("generate.py", [f"ckpt_path={best}", "split=valid", "beam_size=2", "max_len_b=8"], tmp_path / "g")
    assert gen.returncode == 0, describe(gen)
    hyp_file = Path(printed(gen, r"^hypotheses: (.+)$").group(1))
    assert len(hyp_file.read_text().splitlines()) == 500
    printed(gen, r"^ROUGE-1/2/L/Lsum: [0-9.]+/[0-9.]+/[0-9.]+/[0-9.]+$")
    assert lead.group(0) in gen.stdout  # the same baseline, scored the same way


def test_language_model_of_a_model_without_a_decoder_mixer_fails_clearly(tmp_path):
    proc = run("train.py", ["task=wikitext2", "model=convs2s_small", "logger=csv"], tmp_path)
    assert_clean_failure(proc, tmp_path, "seqmix: error:", "no decoder.mixer")
