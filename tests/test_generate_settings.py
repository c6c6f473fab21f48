"""generate.py decodes with the checkpoint's own task settings (issue 35, item 5): generate.yaml's decoding keys
default to null, so a WMT model's beam 4 / lenpen 0.6 and an imported fairseq checkpoint's beam/lenpen apply unless
the command line gives a value; the settings used are printed in one line. Its --help lists generate's keys, not
train.py's config groups."""

from __future__ import annotations

from argparse import Namespace

import pytest
import torch

from seqmix.config.build import build_task, load_task
from seqmix.data.tokenizer import train_tokenizer
from seqmix.generation.options import settings_text
from seqmix.interop.fairseq import import_checkpoint, save_seqmix_checkpoint
from tests.helpers import describe, run, run_config
from tests.interop.fairseq_builders import tiny_transformer_checkpoint

TINY_MODEL = ["model=transformer_small", "model.embed_dim=16", "model.encoder.layers=1", "model.decoder.layers=1",
              "model.encoder.ffn_dim=32", "model.decoder.ffn_dim=32", "model.encoder.heads=2", "model.decoder.heads=2",
              "model.decoder.cross_attention_heads=2"]


@pytest.fixture(scope="module")
def wmt_ckpt(tmp_path_factory):
    """An untrained tiny model saved with task=wmt_ende's run config (its task.generation: beam 4, lenpen 0.6):
    what generate.py reads from a WMT run's checkpoint, without the WMT data."""
    folder = tmp_path_factory.mktemp("wmt")
    torch.manual_seed(0)
    task = build_task(run_config(["task=wmt_ende", *TINY_MODEL]),
                      train_tokenizer(["a b c d e f g h", "h g f e d c b a"] * 20, vocab_size=40))
    save_seqmix_checkpoint(folder / "wmt.ckpt", task)
    (folder / "in.txt").write_text("a b c\nd e f g\n")
    return folder


def settings_line(stdout: str) -> str:
    (line,) = [line for line in stdout.splitlines() if line.startswith("decoding: ")]
    return line


def generate(folder, ckpt, name: str, *args: str):
    proc = run("generate.py", [f"ckpt_path={ckpt}", f"input={folder / 'in.txt'}", f"output={folder / name}.txt",
                               *args], folder / name)
    assert proc.returncode == 0, describe(proc)
    assert len((folder / f"{name}.txt").read_text().splitlines()) == 2
    return settings_line(proc.stdout)


def test_the_task_settings_are_what_the_beam_search_runs_with(wmt_ckpt, monkeypatch):
    """The printed line is made from the options the beam search gets: with no override, the checkpoint's
    task.generation (beam 4, not generate.yaml's old fixed 5)."""
    task, _ = load_task(wmt_ckpt / "wmt.ckpt")
    used = []
    build = task.beam_search
    monkeypatch.setattr(task, "beam_search", lambda **o: used.append(build(**o)) or used[-1])
    for overrides, beam in (({}, 4), ({"beam_size": 2}, 2)):
        task.evaluate_texts(["a b c"], None, 8000, **overrides)
        assert used[-1].options.beam_size == beam and used[-1].options.len_penalty == 0.6
        assert task.decoding_settings(**overrides) == f"beam search {settings_text(used[-1].options)}"


@pytest.mark.slow
def test_a_wmt_checkpoint_decodes_with_its_beam_unless_one_is_given(wmt_ckpt):
    line = generate(wmt_ckpt, wmt_ckpt / "wmt.ckpt", "default")
    assert "beam_size=4 len_penalty=0.6 max_len_a=1.2 max_len_b=10" in line, line
    assert line.endswith("(the checkpoint's task settings)"), line
    line = generate(wmt_ckpt, wmt_ckpt / "wmt.ckpt", "beam2", "beam_size=2")
    assert "beam_size=2 len_penalty=0.6" in line and "from the command line: beam_size" in line, line


@pytest.mark.slow
def test_an_imported_fairseq_checkpoint_decodes_with_its_lenpen_unless_one_is_given(tmp_path):
    container = tiny_transformer_checkpoint(tmp_path)
    data = tmp_path / "data"
    container["cfg"]["generation"] = Namespace(beam=3, lenpen=0.3, max_len_a=1.5, max_len_b=7, min_len=1)
    torch.save(container, tmp_path / "checkpoint.pt")
    import_checkpoint(tmp_path / "checkpoint.pt", data, tmp_path / "m.ckpt", moses=False)
    (tmp_path / "in.txt").write_text("w1 w2 w3\nw4 w5\n")
    line = generate(tmp_path, tmp_path / "m.ckpt", "default")
    assert "beam_size=3 len_penalty=0.3 max_len_a=1.5 max_len_b=7" in line, line
    line = generate(tmp_path, tmp_path / "m.ckpt", "lenpen", "len_penalty=1.5")
    assert "beam_size=3 len_penalty=1.5 max_len_a=1.5" in line and "from the command line: len_penalty" in line, line


@pytest.mark.slow
def test_generate_help_lists_its_own_settings_not_the_training_groups(tmp_path):
    proc = run("generate.py", ["--help"], tmp_path)
    assert proc.returncode == 0, describe(proc)
    for wanted in ("ckpt_path: ???", "beam_size: null", "len_penalty: null", "average_last:", "checkpoint's task"):
        assert wanted in proc.stdout, proc.stdout
    for training_group in ("optim:", "scheduler:", "trainer:", "experiment:", "Configuration groups"):
        assert training_group not in proc.stdout, proc.stdout


def test_validation_decodes_with_eval_generation_and_the_test_and_generate_with_the_task_settings(monkeypatch):
    """The CPU recipes validate greedily (``task.eval_generation.beam_size=1``, fairseq's --eval-bleu-args) while
    their checkpoints keep the task's beam 5 for the final score and generate.py."""
    cfg = run_config(["experiment=multi30k_transformer_cpu", *TINY_MODEL])
    assert cfg.task.generation.beam_size == 5 and cfg.task.eval_generation.beam_size == 1
    task = build_task(cfg, train_tokenizer(["a b c d e f g h", "h g f e d c b a"] * 20, vocab_size=40))
    used = []
    build = task.beam_search
    monkeypatch.setattr(task, "beam_search", lambda **o: used.append(build(**o)) or used[-1])
    batch = {"src_tokens": torch.tensor([[5, 6, 7, task.tokenizer.eos]])}
    for testing, beam in ((False, 1), (True, 5)):
        monkeypatch.setattr(type(task), "trainer", property(lambda self, t=testing: Namespace(testing=t)),
                            raising=False)
        task.eval_outputs(batch)
        assert used[-1].options.beam_size == beam
    task.evaluate_texts(["a b c"], None, 8000)
    assert used[-1].options.beam_size == 5


def test_chrf_and_ter_are_printed_beside_bleu_unless_metrics_says_otherwise(wmt_ckpt):
    """generate.py's metrics= (issue 36): null = chrF and TER for translation, [] = BLEU alone, an unknown name or
    a list on a task without BLEU is one error line."""
    (wmt_ckpt / "ref.txt").write_text("a b c\nd e f\n")
    ref = f"reference={wmt_ckpt / 'ref.txt'}"
    default = run("generate.py", [f"ckpt_path={wmt_ckpt / 'wmt.ckpt'}", f"input={wmt_ckpt / 'in.txt'}", ref,
                                  f"output={wmt_ckpt / 'm.txt'}"], wmt_ckpt / "m")
    assert default.returncode == 0, describe(default)
    names = [line.split(":")[0] for line in default.stdout.splitlines() if "nrefs:" in line]
    assert names == ["sacreBLEU", "paper BLEU", "chrF2", "TER"], default.stdout
    alone = run("generate.py", [f"ckpt_path={wmt_ckpt / 'wmt.ckpt'}", f"input={wmt_ckpt / 'in.txt'}", ref,
                                "metrics=[]", f"output={wmt_ckpt / 'n.txt'}"], wmt_ckpt / "n")
    assert alone.returncode == 0 and "chrF2" not in alone.stdout and "TER" not in alone.stdout, describe(alone)
    bad = run("generate.py", [f"ckpt_path={wmt_ckpt / 'wmt.ckpt'}", f"input={wmt_ckpt / 'in.txt'}", ref,
                              "metrics=[meteor]"], wmt_ckpt / "b")
    assert bad.returncode == 2 and bad.stderr.count("seqmix: error:") == 1 and "chrf" in bad.stderr, describe(bad)
