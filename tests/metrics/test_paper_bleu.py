"""The papers' tokenized BLEU (seqmix.metrics.bleu.paper_bleu) against numbers derived by hand from BLEU's
definition, sacreBLEU on pre-tokenized text, the compound splitting of the WMT En-De papers, and the per-task wiring."""

from __future__ import annotations

import math
from importlib.metadata import version
from types import SimpleNamespace

import pytest
import sacrebleu

from seqmix.config.build import bleu_options
from seqmix.metrics import BleuOptions, paper_bleu
from seqmix.metrics.bleu import paper_tokens, split_compounds
from seqmix.tasks import TranslationTask
from tests.helpers import run_config

SACREMOSES = version("sacremoses")

# Two raw sentences; Moses (English) splits the final punctuation and the comma off:
#   hyp 1 "The cat sat on the mat ."    ref 1 "The cat sat on a mat ."       (7 and 7 tokens)
#   hyp 2 "Hello , world !"             ref 2 "Hello , big world !"          (4 and 5 tokens)
HYPS = ["The cat sat on the mat.", "Hello, world!"]
REFS = ["The cat sat on a mat.", "Hello, big world!"]


def test_tokenized_bleu_by_hand():
    # matched / total n-grams, sentence 1 then 2 (case-sensitive: "the" of hyp 1 is not "The" and "a" is missing):
    #   1-grams: The cat sat on mat .  -> 6/7 ;  Hello , world !            -> 4/4   => 10/11
    #   2-grams: The-cat cat-sat sat-on mat-. -> 4/6 ;  Hello-, world-!      -> 2/3   =>  6/9
    #   3-grams: The-cat-sat cat-sat-on -> 2/5 ;  (none)                     -> 0/2   =>  2/7
    #   4-grams: The-cat-sat-on -> 1/4 ;  (none)                             -> 0/1   =>  1/5
    # lengths: c = 7 + 4 = 11 < r = 7 + 5 = 12, so BP = exp(1 - r/c) = exp(1 - 12/11)
    expected = 100 * math.exp(1 - 12 / 11) * (10 / 11 * 6 / 9 * 2 / 7 * 1 / 5) ** 0.25  # = 39.39
    result = paper_bleu(HYPS, REFS, "tokenized", "en")
    assert result.score == pytest.approx(expected, abs=1e-9)
    assert round(result.score, 2) == 39.39
    assert "90.9/66.7/28.6/20.0 (BP = 0.913 ratio = 0.917 hyp_len = 11 ref_len = 12)" in result.text
    assert paper_tokens(HYPS, "tokenized", "en") == ["The cat sat on the mat .", "Hello , world !"]


def test_signature_names_the_metric_and_carries_sacrebleus():
    result = paper_bleu(HYPS, REFS, "tokenized", "en")
    assert result.signature == (f"BLEU (tokenized, sacremoses {SACREMOSES} en; nrefs:1|case:mixed|eff:no|tok:none|"
                                f"smooth:exp|version:{sacrebleu.__version__})")
    assert str(result).startswith(f"{result.signature} = 39.39 ")
    split = paper_bleu(["Das Konferenz-Zentrum ist groß."], ["Das Konferenz-Zentrum ist groß."], "compound_split",
                       "de")
    assert split.signature.startswith(f"BLEU (tokenized, compound-split, sacremoses {SACREMOSES} de; ")
    low = paper_bleu(HYPS, REFS, "tokenized_lowercase", "en", pretokenized=True)
    assert low.signature.startswith("BLEU (tokenized as read, lowercase; nrefs:1|case:lc|eff:no|tok:none|")


def test_lowercase_kind_ignores_case_and_the_cased_kinds_do_not():
    hyp, ref = ["The Quick Brown Fox jumps."], ["the quick brown fox jumps."]
    assert paper_bleu(hyp, ref, "tokenized_lowercase", "en").score == pytest.approx(100.0)
    # cased: only "jumps" and "." match (2/6 unigrams), so well below 100
    assert paper_bleu(hyp, ref, "tokenized", "en").score < 30
    assert paper_bleu(hyp, ref, "compound_split", "en").score < 30


def test_equals_sacrebleu_without_tokenization_on_pretokenized_text(multi30k_dir):
    """200 Multi30k German references; hypotheses: the same with every other one's last word dropped. The paper
    metric on the raw text = sacreBLEU tokenize=none on the text Moses-tokenized here, and pretokenized=True on
    that tokenized text gives the same number."""
    from sacremoses import MosesTokenizer

    from seqmix.data.sources import iter_lines

    refs = [line for _, line in zip(range(200), iter_lines(multi30k_dir / "val.de.gz"))]
    hyps = [" ".join(r.split()[:-1]) if i % 2 else r for i, r in enumerate(refs)]
    moses = MosesTokenizer("de")
    hyp_tok, ref_tok = ([moses.tokenize(t, return_str=True, escape=False) for t in side] for side in (hyps, refs))
    expected = sacrebleu.corpus_bleu(hyp_tok, [ref_tok], tokenize="none").score
    assert 40 < expected < 100
    assert paper_bleu(hyps, refs, "tokenized", "de").score == pytest.approx(expected, abs=1e-9)
    assert paper_bleu(hyp_tok, ref_tok, "tokenized", "de", pretokenized=True).score == pytest.approx(expected, abs=1e-9)
    lower = sacrebleu.corpus_bleu(hyp_tok, [ref_tok], tokenize="none", lowercase=True).score
    assert paper_bleu(hyps, refs, "tokenized_lowercase", "de").score == pytest.approx(lower, abs=1e-9)


def test_compound_splitting():
    assert split_compounds("Das Konferenz-Zentrum") == "Das Konferenz ##AT##-##AT## Zentrum"
    assert split_compounds("a - b") == "a - b"  # a hyphen between spaces is a dash, not a compound
    assert split_compounds("-a a-") == "-a a-"
    assert split_compounds("x-y z") == "x ##AT##-##AT## y z"
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"  # left to right, no overlapping matches
    assert paper_tokens(["Das Konferenz-Zentrum ist groß - oder?"], "compound_split", "de") == \
        ["Das Konferenz ##AT##-##AT## Zentrum ist groß - oder ?"]
    # a wrong compound now costs three tokens' n-grams, not one token: "Konferenz-Halle" vs "Konferenz-Zentrum"
    #   tokenized:      [Konferenz-Halle ist gut .] vs [Konferenz-Zentrum ist gut .]: 1-grams 3/4
    #   compound-split: [Konferenz ##AT##-##AT## Halle ist gut .] vs [... Zentrum ...]: 1-grams 5/6
    hyp, ref = ["Konferenz-Halle ist gut."], ["Konferenz-Zentrum ist gut."]
    assert "75.0/" in paper_bleu(hyp, ref, "tokenized", "de").text
    assert "83.3/" in paper_bleu(hyp, ref, "compound_split", "de").text


def test_options_validate_and_name_the_logged_metrics():
    assert BleuOptions().paper == () and BleuOptions(paper=None).paper == ()
    assert BleuOptions(paper="compound_split").paper_metrics() == {"bleu_paper": "compound_split"}
    both = BleuOptions(paper=["tokenized_lowercase", "tokenized"])
    assert both.paper_metrics() == {"bleu_paper": "tokenized_lowercase", "bleu_paper_tokenized": "tokenized"}
    for bad in ("multi_bleu", ["tokenized", "tokenized"]):
        with pytest.raises(ValueError, match="task.bleu.paper"):
            BleuOptions(paper=bad)
    with pytest.raises(ValueError, match="tgt_lang"):
        paper_bleu(HYPS, REFS, "tokenized", None)


def test_the_task_reports_paper_bleu_beside_sacrebleu():
    task = SimpleNamespace(bleu=BleuOptions(paper=["tokenized_lowercase", "tokenized"], lang="en"), extra_metrics=())
    report = TranslationTask.score(task, HYPS, [[r] for r in REFS], ["", ""])
    assert report.score == report.metrics["bleu"] == sacrebleu.corpus_bleu(HYPS, [REFS]).score  # headline unchanged
    assert report.metrics["bleu_paper_tokenized"] == pytest.approx(39.39, abs=0.005)
    assert report.metrics["bleu_paper"] == paper_bleu(HYPS, REFS, "tokenized_lowercase", "en").score
    assert report.details[0].startswith("sacreBLEU: nrefs:1|case:mixed|eff:no|tok:13a")
    assert report.details[1].startswith("paper BLEU: BLEU (tokenized, lowercase, sacremoses")
    assert report.details[2].startswith("paper BLEU: BLEU (tokenized, sacremoses")


@pytest.mark.parametrize("task, paper, lang, tokenize", [
    ("wmt_ende", ("compound_split",), "de", "13a"),
    ("wmt_enfr", ("tokenized",), "fr", "13a"),
    ("multi30k_ende", ("tokenized_lowercase", "tokenized"), "de", "13a"),
    ("iwslt14_deen", ("tokenized_lowercase",), "en", "none"),
])
def test_shipped_tasks_name_their_papers_bleu(task, paper, lang, tokenize):
    options = bleu_options(run_config([f"task={task}"]))
    assert (options.paper, options.lang, options.tokenize) == (paper, lang, tokenize)
    assert options.pretokenized == (task == "iwslt14_deen")
