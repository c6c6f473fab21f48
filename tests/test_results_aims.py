"""The aims table above the README's results: each verdict is read from the records, at its boundary (38.5, a gap
of 3, a tie), with the teacher found by the checkpoint a student started from and never a later re-run of its recipe."""

from __future__ import annotations

import pytest

from seqmix.report.aims import AIMS, AUTOREGRESSIVE, aims_text, cpu_recipes, teacher_of
from seqmix.report.records import Recipe
from seqmix.report.results import results_text
from tests.test_results_tables import AVX512, BEAM5, GREEDY, evaluation, record

TEACHER_CKPT = "/runs/teacher/checkpoints/best.ckpt"
LEAD = {"lead3_rouge1": 27.31, "lead3_rouge2": 7.0, "lead3_rougeL": 21.6, "lead3_rougeLsum": 25.45}


def bleu_row(name, bleu, started=10.0, checkpoint=None, more=(), machine=AVX512, decoding=BEAM5):
    rec = record(name, "m", [evaluation(decoding, {"bleu": bleu, "bp": 0.95}), evaluation(GREEDY, {"bleu": 1.0})],
                 more=list(more), started=started, machine=machine)
    rec["checkpoint"] = checkpoint or f"/runs/{name}/checkpoints/best.ckpt"
    return Recipe(name, rec, "K")


def summary_row(rouges, lead=LEAD):
    metrics = dict(zip(("rouge1", "rouge2", "rougeL", "rougeLsum"), rouges, strict=True)) | lead
    return Recipe("dialogsum_transformer_cpu", record("dialogsum_transformer_cpu", "t", [
        evaluation("beam search beam_size=4", metrics)], machine=AVX512), "K")


def a_full_kind(ar=38.6, dynamicconv=39.0, disco=35.6, cmlm=35.6, rouges=(28.0, 7.0, 22.0, 26.0)):
    """Every aim recipe on one AVX-512 kind; the Transformer (38.6 beam 5) is the students' teacher."""
    rows = [bleu_row("multi30k_transformer_cpu", 38.6, started=1.0, checkpoint=TEACHER_CKPT)]
    rows += [bleu_row(n, dynamicconv if "dynamicconv" in n else ar) for n in AUTOREGRESSIVE[1:]]
    rows += [bleu_row(f"multi30k_{s}_cpu", v, more=[f"init_encoder_from={TEACHER_CKPT}"])
             for s, v in (("disco", disco), ("cmlm", cmlm))]
    return [*rows, summary_row(rouges)]


def verdicts(rows, expected=None):
    """The aims table's cells of the one kind, by aim: the second column of each body row."""
    text = aims_text({"K": rows}, expected if expected is not None else [r.name for r in rows])
    lines = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| aim ")]
    cells = [line.split(" | ")[1].removesuffix(" |") for line in lines]
    assert len(cells) == len(AIMS)
    return dict(zip((a.text for a in AIMS), cells, strict=True))


def cell(found, start):
    return next(v for k, v in found.items() if k.startswith(start))


def test_a_kind_that_meets_every_aim_says_met_in_every_cell():
    found = verdicts(a_full_kind())
    assert all(v.startswith("met") for v in found.values()), found
    assert cell(found, "Multi30k: DisCo") == "met: 35.60, 3.00 under transformer's 38.60"
    assert cell(found, "Multi30k: DynamicConv") == "met: 39.00 against 38.60"
    assert cell(found, "Multi30k: every") == "met: lowest transformer 38.60"


@pytest.mark.parametrize("change, aim, says", [
    ({"ar": 38.49}, "Multi30k: every", "missed: 4 of 6 below: lightconv 38.49, talk 38.49, convs2s 38.49, hybrid 38.49"),
    ({"dynamicconv": 38.59}, "Multi30k: DynamicConv", "missed: 38.59 against 38.60"),
    ({"dynamicconv": 38.6}, "Multi30k: DynamicConv", "met: 38.60 against 38.60"),
    ({"disco": 35.59}, "Multi30k: DisCo", "missed: 35.59, 3.01 under transformer's 38.60"),
    ({"disco": 35.596}, "Multi30k: DisCo", "met: 35.60, 3.00 under transformer's 38.60"),
    ({"cmlm": 30.0}, "Multi30k: CMLM", "missed: 30.00, 8.60 under transformer's 38.60"),
    ({"rouges": (28.0, 6.99, 22.0, 25.0)}, "DialogSum",
     "missed (ROUGE-2, ROUGE-Lsum): 28.00 / 6.99 / 22.00 / 25.00 against 27.31 / 7.00 / 21.60 / 25.45"),
])
def test_a_number_past_the_aim_turns_only_its_cell_to_missed(change, aim, says):
    found = verdicts(a_full_kind(**change))
    assert cell(found, aim) == says
    assert all(v.startswith("met") for k, v in found.items() if not k.startswith(aim)), found


def test_a_recipe_not_run_or_not_scored_with_beam_5_leaves_the_aim_open():
    rows = [r for r in a_full_kind() if r.name != "multi30k_talk_cpu"]
    rows.append(bleu_row("multi30k_talk_cpu", 40.0, decoding="beam search beam_size=4"))
    found = verdicts(rows, expected=[*(r.name for r in rows), "wikitext2_talk_cpu"])
    assert cell(found, "Multi30k: every") == "open: all 5 run at or above; not run: talk"
    assert cell(found, "every CPU recipe") == f"open: {len(rows)} of {len(rows) + 1}; not run: wikitext2_talk"
    lone = verdicts([bleu_row("multi30k_lightconv_cpu", 39.0)])
    assert cell(lone, "Multi30k: DynamicConv") == "not run" and cell(lone, "Multi30k: DisCo") == "not run"
    assert cell(lone, "DialogSum") == "not run"


def test_the_teacher_is_the_checkpoint_the_student_started_from_never_a_later_re_run():
    rows = a_full_kind()
    disco = next(r for r in rows if r.name == "multi30k_disco_cpu")
    assert teacher_of(disco, {r.name: r for r in rows}).name == "multi30k_transformer_cpu"
    re_run = [bleu_row("multi30k_transformer_cpu", 41.0, started=99.0, checkpoint=TEACHER_CKPT)
              if r.name == "multi30k_transformer_cpu" else r for r in rows]
    assert teacher_of(disco, {r.name: r for r in re_run}) is None
    assert cell(verdicts(re_run), "Multi30k: DisCo") == "open: 35.60; its teacher is not a row here"
    from_scratch = [bleu_row("multi30k_disco_cpu", 35.6) if r.name == "multi30k_disco_cpu" else r for r in rows]
    assert cell(verdicts(from_scratch), "Multi30k: DisCo") == "open: 35.60; its teacher is not a row here"


@pytest.mark.parametrize("machine", [{**AVX512, "cpu_flags": ["avx2"]}, {**AVX512, "gpu": "NVIDIA H100"}])
def test_the_38_5_aim_is_for_avx_512_cpus_only(machine):
    rows = [bleu_row(n, 20.0, machine=machine) for n in AUTOREGRESSIVE]
    assert cell(verdicts(rows), "Multi30k: every") == "n/a: not an AVX-512 CPU"


def test_a_summary_record_without_the_lead_baseline_is_open_not_met():
    found = verdicts([summary_row((40.0, 20.0, 30.0, 35.0), lead={})])
    assert cell(found, "DialogSum") == "open: no lead baseline in its record"


def test_the_aims_name_real_cpu_recipes_and_come_first_in_the_results():
    recipes = cpu_recipes()
    assert set(AUTOREGRESSIVE) | {"multi30k_disco_cpu", "multi30k_cmlm_cpu", "dialogsum_transformer_cpu"} <= set(recipes)
    assert not any(name.endswith("common") for name in recipes)
    rows = a_full_kind()
    with_aims, without = results_text(rows, recipes), results_text(rows)
    assert "### Aims" not in without
    assert with_aims.index("### Aims") < with_aims.index("### Translation")
    assert with_aims.replace(aims_text({"K": rows}, recipes) + "\n", "") == without
