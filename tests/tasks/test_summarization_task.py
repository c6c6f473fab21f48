"""SummarizationTask: trigram blocking in its decoding, ROUGE + lead baseline as rouge-score computes them."""

from __future__ import annotations

import functools

import pytest
import torch

from seqmix.data.tokenizer import train_tokenizer
from seqmix.generation import BeamOptions
from seqmix.metrics import RougeOptions, corpus_rouge, lead
from seqmix.mixers import LightConv
from seqmix.models import EncoderDecoder
from seqmix.tasks import SummarizationTask

DOCS = ["The cat sat on the mat. It was warm. Then it slept. The end.",
        "A dog ran in the park! It barked at birds. Nobody minded.",
        "#Person1#: Hello, how are you?\n#Person2#: Fine, thanks. And you?\n#Person1#: Good."]
REFS = [["A cat sat and slept."], ["A dog ran and barked.", "The dog barked at birds."], ["Two people greet."]]


def task(**generation):
    tok = train_tokenizer(DOCS + [r for refs in REFS for r in refs], vocab_size=120, min_frequency=1)
    torch.manual_seed(0)
    mix = functools.partial(LightConv, num_heads=2, kernel_size=3)
    model = EncoderDecoder(tok.vocab_size, tok.vocab_size, tok.pad, 16, encoder=dict(layers=1, ffn_dim=32, mixer=mix),
                           decoder=dict(layers=1, ffn_dim=32, mixer=mix, cross_attention_heads=2), dropout=0.0)
    return SummarizationTask(model.eval(), tok, optimizer=torch.optim.Adam, generation=BeamOptions(**generation),
                             rouge=RougeOptions(stemming=True, lead=2))


def trigrams(tokens: list[int]) -> list[tuple]:
    return [tuple(tokens[i: i + 3]) for i in range(len(tokens) - 2)]


def test_trigram_blocking_never_repeats_a_trigram():
    opts = dict(beam_size=4, min_len_b=40, max_len_b=50, stepwise_len_penalty=True, len_penalty=1.5)
    t = task(no_repeat_ngram_size=3, **opts)
    rows = [torch.tensor(t.tokenizer.encode(d) + [t.tokenizer.eos]) for d in DOCS[:2]]
    src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=t.tokenizer.pad)
    blocked = t.beam_search().generate(t.model, src)
    free = t.beam_search(no_repeat_ngram_size=0).generate(t.model, src)
    assert any(len(set(trigrams(h.tokens.tolist()))) < len(trigrams(h.tokens.tolist())) for hs in free for h in hs)
    for hyps in blocked:
        for h in hyps:
            grams = trigrams(h.tokens.tolist())
            assert len(grams) >= 38 and len(set(grams)) == len(grams)


def test_rouge_and_lead_baseline_as_rouge_score_computes_them():
    t = task(beam_size=2, max_len_b=10, no_repeat_ngram_size=3)
    hyps, report = t.evaluate_texts(DOCS, REFS, max_tokens=500)
    assert len(hyps) == 3
    norm = t.tokenizer.normalize_reference
    refs = [[norm(r) for r in rs] for rs in REFS]
    model = corpus_rouge(hyps, refs, stemming=True)
    baseline = corpus_rouge([norm(lead(d, 2)) for d in DOCS], refs, stemming=True)
    assert report.score == model.rougeL
    assert report.headline == f"ROUGE-1/2/L/Lsum: {model.scores()}"
    assert report.metrics == {"rouge1": model.rouge1, "rouge2": model.rouge2, "rougeL": model.rougeL,
                              "rougeLsum": model.rougeLsum, "lead2_rouge1": baseline.rouge1,
                              "lead2_rouge2": baseline.rouge2, "lead2_rougeL": baseline.rougeL,
                              "lead2_rougeLsum": baseline.rougeLsum}  # the results table's baseline column
    assert f"lead-2 baseline: {baseline}" in report.details
    assert baseline.rouge1 > 20  # the lead sentences share words with the references


def test_long_documents_are_truncated_not_rejected():
    t = task(beam_size=1, max_len_b=3)
    t.model.max_source_positions = 8
    hyps, report = t.evaluate_texts([DOCS[0] * 5], None, max_tokens=500)
    assert len(hyps) == 1 and report is None


SUMMARIZATION_TASKS = ["cnndm", "dialogsum", "scitldr", "xsum"]


@pytest.mark.parametrize("name", SUMMARIZATION_TASKS)
def test_generation_settings_flow_from_the_config_to_the_generator(name):
    """task.generation (min/max length, trigram blocking, length penalty) reaches the BeamSearch the task decodes
    with, and task.data.truncate_source reaches both the data module and the task's own source preparation."""
    from hydra.utils import instantiate
    from omegaconf import open_dict

    from seqmix.config.build import build_task
    from tests.test_configs import compose_train, resolve_outside_hydra

    cfg = resolve_outside_hydra(compose_train([f"task={name}", "model=lightconv_small",
                                               "task.generation.len_penalty=0.7", "task.generation.min_len_b=3"]))
    with open_dict(cfg):
        del cfg["hydra"]  # as in a run: the job's config has no hydra node (resolvers use HydraConfig)
    gen = cfg.task.generation
    assert gen.no_repeat_ngram_size == 3 and gen.stepwise_len_penalty
    base = task()
    t = build_task(cfg, base.tokenizer, model=base.model)
    assert isinstance(t, SummarizationTask)
    search = t.beam_search()
    for key in ("beam_size", "min_len_a", "min_len_b", "max_len_a", "max_len_b", "no_repeat_ngram_size",
                "len_penalty", "stepwise_len_penalty"):
        assert getattr(search.options, key) == gen[key], key
    assert (search.options.len_penalty, search.options.min_len_b) == (0.7, 3)  # command-line overrides too
    assert t.beam_search(beam_size=1).options.beam_size == 1 and t.beam_search().options.beam_size == gen.beam_size
    assert t.rouge == RougeOptions(cfg.task.rouge.stemming, cfg.task.rouge.lead)
    limit = int(cfg.task.data.truncate_source)
    assert instantiate(cfg.task.data, _convert_="all").truncate_source == limit
    assert t.prepare_source_ids([list(range(limit + 50)), [5, 6]]) == [list(range(limit)), [5, 6]]


def test_decoding_obeys_the_configured_bounds_and_blocking():
    """The same settings seen from the outputs: lengths inside [min_len_b, max_len_b] and no repeated trigram."""
    t = task(beam_size=3, min_len_b=9, max_len_b=12, no_repeat_ngram_size=3, len_penalty=2.0,
             stepwise_len_penalty=True)
    rows = [torch.tensor(t.tokenizer.encode(d) + [t.tokenizer.eos]) for d in DOCS]
    src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=t.tokenizer.pad)
    for hyps in t.beam_search().generate(t.model, src):
        assert len(hyps) == 3
        for h in hyps:
            toks = h.tokens.tolist()
            assert 9 <= len(toks) - 1 <= 12 and toks[-1] == t.tokenizer.eos
            assert len(set(trigrams(toks))) == len(trigrams(toks))


def test_every_reference_of_a_record_reaches_the_score(tmp_path):
    """SciTLDR-style records (a list of TL;DRs each) through the data module into the task's corpus report: a
    hypothesis equal to any one of an example's references scores 100, one equal to none of them does not."""
    import json

    from seqmix.data import JsonlSummarySource, TranslationDataModule

    records = [{"source": ["The paper studies cats.", "It finds they sleep."], "paper_id": "a",
                "target": ["Cats sleep a lot.", "A study of sleeping cats.", "We watch cats nap."]},
               {"source": ["We train dogs.", "They learn fast."], "paper_id": "b",
                "target": ["Dogs learn fast when trained."]},
               {"source": ["Birds sing at dawn."], "paper_id": "c", "target": ["Birds sing.", "Dawn songs of birds."]}]
    for split in ("train", "dev"):
        (tmp_path / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    dm = TranslationDataModule(JsonlSummarySource(str(tmp_path), "source", ["target"]), "abstract", "tldr",
                                 {"train": "train", "valid": "dev"}, {"vocab_size": 200, "min_frequency": 1},
                                 cache_dir=str(tmp_path / "cache"))
    dm.setup()
    refs = dm.reference_sets("valid")
    assert [len(r) for r in refs] == [3, 1, 2] and refs[0][2] == dm.tokenizer.normalize_reference("We watch cats nap.")
    t = task()
    t.reference_source = dm
    last = t.corpus_report("valid", "val", {i: (r[-1], None) for i, r in enumerate(refs)}, 0.0, 1)  # eval_outputs
    model_scores = {k: v for k, v in last.metrics.items() if not k.startswith("lead")}
    assert model_scores == pytest.approx(dict.fromkeys(model_scores, 100.0)) and len(model_scores) == 4
    wrong = t.corpus_report("valid", "val", {0: (refs[2][0], None), 1: (refs[0][1], None), 2: (refs[1][0], None)},
                            0.0, 1)
    assert wrong.metrics["rouge1"] < 50
