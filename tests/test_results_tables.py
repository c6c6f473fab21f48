"""``python -m seqmix.report results``: the README's results tables come from run records only. Fixture records
become exactly the expected tables (which evaluation fills which cell, provenance, signatures); the README holds
what the committed records say; a real run records its machine, commit and scored decodes; mistakes are one line."""

from __future__ import annotations

import json

import pytest

from seqmix.errors import SeqmixError
from seqmix.report.aims import cpu_recipes
from seqmix.report.records import RECORDS, Recipe, add_run, kind_folder, read_recipes
from seqmix.report.results import RESULTS_BEGIN, RESULTS_END, main, readme_section, results_text, write_readme
from seqmix.training import provenance
from tests.helpers import ROOT, TINY, run

AVX512 = {"cpu": "AMD EPYC", "cpu_flags": ["avx2", "avx512f", "avx512_bf16"], "threads": 2, "gpu": None}
SACRE = "sacreBLEU: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0 = 35.00 70/40/25/15 (BP = 0.970)"
PAPER = "paper BLEU: BLEU (tokenized, lowercase, sacremoses 0.1.1 de; nrefs:1|tok:none) = 35.40 70/41/26/16"
BEAM5 = "beam search beam_size=5 len_penalty=1.0"
GREEDY = "beam search beam_size=1 len_penalty=1.0"


def evaluation(decoding, metrics, checkpoint="best.ckpt", when=1.0, split="valid", details=()):
    return {"split": split, "decoding": decoding, "checkpoint": checkpoint, "metrics": metrics, "when": when,
            "details": list(details)}


def record(experiment, model, evaluations, **extra):
    return {"status": "finished", "overrides": [f"experiment={experiment}", "logger=csv", *extra.pop("more", [])],
            "model": model, "parameters": 7_612_416, "updates": 2084, "wall_seconds": 2830.0,
            "precision": "bf16-mixed", "machine": AVX512, "commit": "0123456789ab",
            "checkpoint": "/somewhere/runs/x/checkpoints/best.ckpt", "evaluations": evaluations, **extra}


def write_records(folder, records):
    folder.mkdir(parents=True, exist_ok=True)
    for name, rec in records.items():
        (folder / f"{name}.json").write_text(json.dumps(rec))


def fixture_records():
    translation = record("m30k_t", "transformer_small", [
        evaluation(BEAM5, {"bleu": 35.0, "bp": 0.97, "bleu_paper": 35.4, "bleu_paper_tokenized": 35.2},
                   details=[SACRE, PAPER], when=1),
        evaluation(GREEDY, {"bleu": 33.5, "bp": 0.95}, when=2),
        # not the kept checkpoint, not valid: never shown
        evaluation(BEAM5, {"bleu": 99.0, "bp": 1.0}, checkpoint="last.ckpt", when=3),
        evaluation(BEAM5, {"bleu": 98.0, "bp": 1.0}, split="test", when=4),
    ], more=["seed=2"])
    rescored = record("m30k_l", "lightconv_small", [
        evaluation(BEAM5, {"bleu": 36.0, "bp": 0.96}, when=1),
        evaluation(BEAM5, {"bleu": 36.5, "bp": 0.98}, when=5),  # a later scoring with the same settings wins
    ], parameters=512_000, machine={**AVX512, "cpu_flags": ["avx2"]}, precision="32-true")
    lm = record("wt2_t", "transformer_lm", [evaluation("perplexity tokens_per_sample=128", {"perplexity": 170.44})])
    summary = record("ds_l", "lightconv_small", [evaluation("beam search beam_size=4", {
        "rouge1": 31.49, "rouge2": 9.19, "rougeL": 25.89, "rougeLsum": 28.54, "lead3_rouge1": 27.31,
        "lead3_rouge2": 7.0, "lead3_rougeL": 21.6, "lead3_rougeLsum": 25.45}), evaluation("beam search beam_size=1", {
        "rouge1": 30.01, "rouge2": 8.5, "rougeL": 24.0, "rougeLsum": 27.0}, when=2)],
        machine={**AVX512, "gpu": "NVIDIA H100"})
    return {"m30k_t": translation, "m30k_l": rescored, "wt2_t": lm, "ds_l": summary}


EXPECTED = """The rows below ran on 3 machine kinds, each with its own tables (updates and wall time compare only within one): AMD EPYC, 2 threads, AVX512-BF16 (2 recipes); AMD EPYC, 2 threads, AVX2 (1 recipe); NVIDIA H100 (1 recipe).

### On AMD EPYC, 2 threads, AVX512-BF16

#### Translation

| recipe (`python train.py ...`) | model | updates | wall (min) | precision | valid sacreBLEU, beam 5 (BP) | papers' BLEU, beam 5 | valid sacreBLEU, greedy (BP) | machine | commit |
|---|---|---|---|---|---|---|---|---|---|
| `experiment=m30k_t seed=2` | transformer_small (7.6M) | 2,084 | 47.2 | bf16-mixed | 35.00 (0.970) | 35.40 / 35.20 | 33.50 (0.950) | AMD EPYC, 2 threads, AVX512-BF16 | `0123456789ab` |

sacreBLEU of detokenized output against the raw references (signature `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0`) with its brevity penalty; papers' BLEU: (1) BLEU (tokenized, lowercase, sacremoses 0.1.1 de; nrefs:1|tok:none); greedy: `python generate.py ckpt_path=<run>/checkpoints/best.ckpt split=valid beam_size=1`.

#### Language modeling

| recipe (`python train.py ...`) | model | updates | wall (min) | precision | valid perplexity | machine | commit |
|---|---|---|---|---|---|---|---|
| `experiment=wt2_t` | transformer_lm (7.6M) | 2,084 | 47.2 | bf16-mixed | 170.44 | AMD EPYC, 2 threads, AVX512-BF16 | `0123456789ab` |

Perplexity over the whole valid split, best.ckpt.

### On AMD EPYC, 2 threads, AVX2

#### Translation

| recipe (`python train.py ...`) | model | updates | wall (min) | precision | valid sacreBLEU, beam 5 (BP) | papers' BLEU, beam 5 | valid sacreBLEU, greedy (BP) | machine | commit |
|---|---|---|---|---|---|---|---|---|---|
| `experiment=m30k_l` | lightconv_small (512K) | 2,084 | 47.2 | 32-true | 36.50 (0.980) | - | - | AMD EPYC, 2 threads, AVX2 | `0123456789ab` |

sacreBLEU of detokenized output against the raw references (signature `-`) with its brevity penalty; papers' BLEU: none; greedy: `python generate.py ckpt_path=<run>/checkpoints/best.ckpt split=valid beam_size=1`.

### On NVIDIA H100

#### Summarization

| recipe (`python train.py ...`) | model | updates | wall (min) | precision | valid ROUGE-1/2/L/Lsum F1, task's decoding | valid ROUGE, greedy | lead-N baseline, same split | machine | commit |
|---|---|---|---|---|---|---|---|---|---|
| `experiment=ds_l` | lightconv_small (7.6M) | 2,084 | 47.2 | bf16-mixed | 31.49 / 9.19 / 25.89 / 28.54 (beam 4) | 30.01 / 8.50 / 24.00 / 27.00 | 27.31 / 7.00 / 21.60 / 25.45 (lead-3) | NVIDIA H100 | `0123456789ab` |

rouge-score F1 with stemming, best.ckpt; greedy: `python generate.py ckpt_path=<run>/checkpoints/best.ckpt split=valid beam_size=1`.
"""


def test_fixture_records_become_exactly_the_expected_tables(tmp_path):
    write_records(tmp_path, fixture_records())
    assert results_text(read_recipes(tmp_path)) == EXPECTED


def test_one_machine_kind_is_said_as_one():
    recipes = fixture_records()
    del recipes["ds_l"], recipes["m30k_l"]
    folder_free = [Recipe(name, rec) for name, rec in sorted(recipes.items())]
    assert results_text(folder_free).splitlines()[0] == ("Every row below ran on one machine kind: "
                                                         "AMD EPYC, 2 threads, AVX512-BF16.")


def test_a_re_run_keeps_the_record_it_replaces_out_of_the_tables(tmp_path):
    """--add of a new run of a recipe moves the old record to earlier/ (named by its commit); the same run added
    twice moves nothing; the tables read only the current records."""
    records = tmp_path / "records"
    for n, commit in enumerate(["aaaaaaaaaaaa1111", "bbbbbbbbbbbb2222", "bbbbbbbbbbbb2222"]):
        run_dir = tmp_path / f"run{n}"
        run_dir.mkdir()
        rec = record("m30k_t", "transformer_small", [evaluation(BEAM5, {"bleu": 30.0 + n, "bp": 1.0})], commit=commit)
        (run_dir / "run.json").write_text(json.dumps(rec))
        add_run(run_dir, records)
        add_run(run_dir, records)  # again: nothing moves
    earlier = sorted(p.name for p in (records / "earlier").iterdir())
    assert earlier == ["m30k_t.aaaaaaaaaaaa.1.json", "m30k_t.bbbbbbbbbbbb.1.json"]
    assert json.loads((records / "earlier" / earlier[0]).read_text())["evaluations"][0]["metrics"]["bleu"] == 30.0
    assert json.loads((records / "earlier" / earlier[1]).read_text())["evaluations"][0]["metrics"]["bleu"] == 31.0
    [recipe] = read_recipes(records)
    assert recipe.final()["metrics"]["bleu"] == 32.0


def test_a_run_scored_again_replaces_its_own_record_without_an_earlier_copy(tmp_path):
    records, run_dir = tmp_path / "records", tmp_path / "run"
    run_dir.mkdir()
    scorings = [evaluation(BEAM5, {"bleu": 30.0, "bp": 1.0})]
    rec = record("m30k_t", "transformer_small", scorings, started="2026-11-29T10:00:00")
    (run_dir / "run.json").write_text(json.dumps(rec))
    add_run(run_dir, records)
    rec["evaluations"] = [*scorings, evaluation(BEAM5, {"bleu": 31.0, "bp": 1.0}, when=2)]
    (run_dir / "run.json").write_text(json.dumps(rec))
    add_run(run_dir, records)
    assert not (records / "earlier").exists()
    assert read_recipes(records)[0].final()["metrics"]["bleu"] == 31.0
    rec["started"] = "2026-11-29T11:00:00"  # another run of the recipe: the old record is kept
    (run_dir / "run.json").write_text(json.dumps(rec))
    add_run(run_dir, records)
    assert [p.name for p in (records / "earlier").iterdir()] == ["m30k_t.0123456789ab.1.json"]


def test_a_probe_decode_with_options_set_never_fills_the_rows_columns():
    """Only scorings that set no decoding option (greedy: beam_size alone) fill a row, however late a probe came;
    records from before options_given count every scoring as they did."""
    task_own = evaluation(BEAM5, {"bleu": 30.0, "bp": 0.9}, when=1)
    greedy = evaluation(GREEDY, {"bleu": 29.0, "bp": 0.9}, when=2)
    probes = [evaluation(BEAM5.replace("len_penalty=1.0", "len_penalty=2.0"), {"bleu": 27.0, "bp": 1.0}, when=3),
              evaluation(GREEDY.replace("len_penalty=1.0", "len_penalty=2.0"), {"bleu": 26.0, "bp": 1.0}, when=4)]
    task_own["options_given"], greedy["options_given"] = [], ["beam_size"]
    probes[0]["options_given"], probes[1]["options_given"] = ["len_penalty"], ["beam_size", "len_penalty"]
    recipe = Recipe("m30k_t", record("m30k_t", "transformer_small", [task_own, greedy, *probes]))
    assert recipe.final()["metrics"]["bleu"] == 30.0 and recipe.greedy()["metrics"]["bleu"] == 29.0
    for e in (task_own, greedy, *probes):
        del e["options_given"]
    assert recipe.final()["metrics"]["bleu"] == 27.0 and recipe.greedy()["metrics"]["bleu"] == 26.0


def test_a_record_without_a_valid_scoring_of_its_best_checkpoint_is_named(tmp_path):
    rec = record("m30k_x", "transformer_small", [evaluation(BEAM5, {"bleu": 1.0}, checkpoint="last.ckpt")])
    write_records(tmp_path, {"m30k_x": rec})
    with pytest.raises(SeqmixError, match="m30k_x.*generate.py"):
        results_text(read_recipes(tmp_path))


@pytest.mark.parametrize("content,says", [("{not json", "damaged"), (json.dumps({"status": "running"}), "finished")])
def test_a_damaged_or_unfinished_record_file_is_named(tmp_path, content, says):
    (tmp_path / "bad.json").write_text(content)
    with pytest.raises(SeqmixError, match=f"bad.json.*{says}"):
        read_recipes(tmp_path)


def test_the_readme_holds_what_the_committed_records_say():
    """README's results section is exactly the generator's output on benchmarks/results/recipes: `make results`
    after adding a run, never a hand edit."""
    readme = ROOT / "README.md"
    assert RESULTS_BEGIN in readme.read_text() and RESULTS_END in readme.read_text()
    assert readme_section(readme) == results_text(read_recipes(ROOT / RECORDS), cpu_recipes()), "run `make results`"


def test_write_readme_replaces_only_the_marked_part(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# top\n{RESULTS_BEGIN}\nold rows\n{RESULTS_END}\n## after\n")
    write_readme(readme, "### New\n")
    assert readme.read_text() == f"# top\n{RESULTS_BEGIN}\n\n### New\n\n{RESULTS_END}\n## after\n"
    (tmp_path / "plain.md").write_text("# no marks\n")
    with pytest.raises(SeqmixError, match="lacks the marks"):
        write_readme(tmp_path / "plain.md", "x")


def test_a_real_run_is_recorded_added_and_tabulated(tmp_path):
    """train.py records machine, commit and its final evaluation; generate.py split=valid on the run's checkpoint
    adds its decode (input= does not); --add copies the record under the recipe's name; the table's cells are the
    printed scores."""
    runs = tmp_path / "run"
    proc = run("train.py", [*TINY, "experiment=multi30k_transformer_cpu", "task=toy_reverse", "trainer.max_steps=6",
                            "trainer.max_time=null", "trainer.precision=32", f"hydra.run.dir={runs}",
                            "task.data.splits.test=null", "trainer.val_check_interval=null",
                            "trainer.check_val_every_n_epoch=1"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ckpt = runs / "checkpoints" / "best.ckpt"
    greedy = run("generate.py", [f"ckpt_path={ckpt}", "split=valid", "beam_size=1", f"output={tmp_path}/h.txt"],
                 tmp_path)
    assert greedy.returncode == 0 and "recorded in" in greedy.stdout, greedy.stderr[-2000:]
    (tmp_path / "in.txt").write_text("a b c\n")
    other = run("generate.py", [f"ckpt_path={ckpt}", "input=" + str(tmp_path / "in.txt"), f"output={tmp_path}/o.txt"],
                tmp_path)
    assert other.returncode == 0 and "recorded in" not in other.stdout, other.stderr[-2000:]
    rec = json.loads((runs / "run.json").read_text())
    assert rec["machine"]["threads"] >= 1 and rec["commit"] and rec["model"] == "transformer_small"
    assert [(e["split"], "beam_size=1" in e["decoding"]) for e in rec["evaluations"]] == [("valid", False),
                                                                                            ("valid", True)]
    assert [e["options_given"] for e in rec["evaluations"]] == [[], ["beam_size"]]
    printed = [float(line.split()[-1]) for line in (proc.stdout + greedy.stdout).splitlines()
               if line.startswith(("valid BLEU:", "BLEU:"))]
    assert [e["metrics"]["bleu"] for e in rec["evaluations"]] == pytest.approx(printed, abs=0.005)
    target = add_run(runs, tmp_path / "records")
    assert (target.parent.name, target.name) == (kind_folder(rec["machine"]), "multi30k_transformer_cpu.json")
    [row] = [line for line in results_text(read_recipes(tmp_path / "records")).splitlines()
             if line.startswith("| `experiment=multi30k_transformer_cpu")]
    assert f"{printed[0]:.2f} (" in row and f"{printed[1]:.2f} (" in row and "`experiment=multi30k_transformer_cpu" in row


def test_add_refuses_runs_that_cannot_make_a_row(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(SeqmixError, match="no readable run.json"):
        add_run(tmp_path / "a", tmp_path / "records")
    (tmp_path / "a" / "run.json").write_text(json.dumps({"status": "running", "overrides": ["experiment=x"]}))
    with pytest.raises(SeqmixError, match="did not finish"):
        add_run(tmp_path / "a", tmp_path / "records")
    (tmp_path / "a" / "run.json").write_text(json.dumps({"status": "finished", "overrides": ["seed=1"]}))
    with pytest.raises(SeqmixError, match="experiment="):
        add_run(tmp_path / "a", tmp_path / "records")
    assert not (tmp_path / "records").exists()


def test_a_run_on_another_machine_kind_makes_its_own_tables_and_replaces_only_its_kind_s_record(tmp_path, capsys):
    """The same recipe on two machine kinds is two rows in two sets of tables; a re-run on one kind moves only that
    kind's record to earlier/; the command says at once which tables a run joined."""
    records = tmp_path / "records"
    avx2 = {**AVX512, "cpu_flags": ["avx2"]}
    for n, machine in enumerate((AVX512, avx2, avx2)):
        run_dir = tmp_path / f"run{n}"
        run_dir.mkdir()
        rec = record("m30k_t", "transformer_small", [evaluation(BEAM5, {"bleu": 30.0 + n, "bp": 1.0})],
                     machine=machine, commit=f"{n}" * 12)
        (run_dir / "run.json").write_text(json.dumps(rec))
        assert main(["--add", str(run_dir), "--records", str(records)]) == 0
        kind = "AMD EPYC, 2 threads, AVX512-BF16" if n == 0 else "AMD EPYC, 2 threads, AVX2"
        assert f"m30k_t.json: a row of the tables on {kind} (1 recipe there)" in capsys.readouterr().out
    assert sorted(p.relative_to(records).as_posix() for p in records.rglob("*.json")) == [
        "amd-epyc-2-threads-avx2/m30k_t.json", "amd-epyc-2-threads-avx512-bf16/m30k_t.json",
        "earlier/m30k_t.111111111111.1.json"]
    text = results_text(read_recipes(records))
    assert text.splitlines()[0] == ("The rows below ran on 2 machine kinds, each with its own tables (updates and "
                                    "wall time compare only within one): AMD EPYC, 2 threads, AVX2 (1 recipe); "
                                    "AMD EPYC, 2 threads, AVX512-BF16 (1 recipe).")
    tables = text.split("### On ")[1:]
    assert [t.splitlines()[0] for t in tables] == ["AMD EPYC, 2 threads, AVX2", "AMD EPYC, 2 threads, AVX512-BF16"]
    assert ["32.00 (1.000)" in tables[0], "30.00 (1.000)" in tables[1]] == [True, True]
    assert "31.00" not in text


def test_two_records_of_one_recipe_on_one_machine_kind_are_named(tmp_path):
    rec = record("m30k_t", "transformer_small", [evaluation(BEAM5, {"bleu": 30.0, "bp": 1.0})])
    write_records(tmp_path, {"m30k_t": rec})
    write_records(tmp_path / kind_folder(AVX512), {"m30k_t": rec})
    with pytest.raises(SeqmixError, match="m30k_t.json and .*m30k_t.json are both m30k_t on AMD EPYC"):
        read_recipes(tmp_path)


def test_a_cpu_generation_names_the_row_s_cpu_and_a_second_generation_makes_a_set_of_its_own(tmp_path, capsys):
    """A virtual machine's model name hides the CPU's generation (``AMD EPYC``); the record's family and model go in
    the machine column and records without them stay in the same kind. A run on a second generation under the same
    label starts its own set (its own folder and tables, headings naming each generation) and breaks up neither;
    one placed by hand among the other generation's records is named."""
    records = tmp_path / "records"
    zen5, zen4 = ({**AVX512, "cpu_generation": f"family {f} model {m}"} for f, m in ((26, 2), (25, 17)))
    runs = (("m30k_t", AVX512), ("m30k_l", zen5), ("m30k_d", zen4), ("m30k_t", zen4), ("m30k_c", zen5))
    for n, (name, machine) in enumerate(runs):
        run_dir = tmp_path / f"run{n}"
        run_dir.mkdir()
        (run_dir / "run.json").write_text(json.dumps(record(name, "transformer_small",
                                                            [evaluation(BEAM5, {"bleu": 30.0 + n, "bp": 1.0})],
                                                            machine=machine, commit=f"{n}" * 12)))
    for n in (0, 1):
        add_run(tmp_path / f"run{n}", records)
    text = results_text(read_recipes(records))
    assert text.splitlines()[0] == "Every row below ran on one machine kind: AMD EPYC, 2 threads, AVX512-BF16."
    rows = {line.split("`")[1]: line for line in text.splitlines() if line.startswith("| `experiment=")}
    assert "| AMD EPYC (family 26 model 2), 2 threads, AVX512-BF16 |" in rows["experiment=m30k_l"]
    assert "| AMD EPYC, 2 threads, AVX512-BF16 |" in rows["experiment=m30k_t"]
    capsys.readouterr()
    for n in (2, 3, 4):
        assert main(["--add", str(tmp_path / f"run{n}"), "--records", str(records)]) == 0
    out = capsys.readouterr().out
    assert "m30k_d.json: a row of the tables on AMD EPYC (family 25 model 17), 2 threads, AVX512-BF16 (1 recipe there)" in out
    assert "m30k_c.json: a row of the tables on AMD EPYC (family 26 model 2), 2 threads, AVX512-BF16 (3 recipes there)" in out
    zen4_folder = "amd-epyc-family-25-model-17-2-threads-avx512-bf16"
    assert sorted(p.relative_to(records).as_posix() for p in records.rglob("*.json")) == [
        *(f"amd-epyc-2-threads-avx512-bf16/{n}.json" for n in ("m30k_c", "m30k_l", "m30k_t")),
        *(f"{zen4_folder}/{n}.json" for n in ("m30k_d", "m30k_t"))]
    text = results_text(read_recipes(records))
    assert text.splitlines()[0].endswith("(updates and wall time compare only within one): AMD EPYC (family 26 model "
                                         "2), 2 threads, AVX512-BF16 (3 recipes); AMD EPYC (family 25 model 17), 2 "
                                         "threads, AVX512-BF16 (2 recipes).")
    tables = {t.splitlines()[0]: t for t in text.split("### On ")[1:]}
    zen4_table = tables["AMD EPYC (family 25 model 17), 2 threads, AVX512-BF16"]
    assert "33.00 (1.000)" in zen4_table and "30.00" not in zen4_table
    assert "30.00 (1.000)" in tables["AMD EPYC (family 26 model 2), 2 threads, AVX512-BF16"]
    (records / kind_folder(AVX512) / "m30k_d.json").write_text((tmp_path / "run2" / "run.json").read_text())
    with pytest.raises(SeqmixError, match="m30k_[cl].json \\(family 26 model 2\\) and .*m30k_d.json \\(family 25 "
                                          "model 17\\) are both on AMD EPYC, 2 threads, AVX512-BF16"):
        read_recipes(records)


def test_the_cpu_generation_comes_from_proc_cpuinfo_s_family_and_model():
    info = {"cpu family": "26", "model": "2", "model name": "AMD EPYC"}
    assert provenance.cpu_generation(info) == "family 26 model 2"
    assert provenance.cpu_generation({"model name": "Apple M2"}) is None
    assert provenance.machine()["cpu_generation"] == provenance.cpu_generation()
