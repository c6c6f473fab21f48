"""Backward compatibility with the tree before the restructuring (fixtures made by it, see tests/fixtures/README.md):
(a) every experiment config, and every row of the two paper ablations, builds a model of the size the old tree built;
(b) a checkpoint trained by the old tree's train.py decodes, with generate.py, to what the old tree decoded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seqmix.config.build import model_from_config
from seqmix.config.mixer_group import settle_mixer_choice
from seqmix.config.resolvers import register_resolvers
from seqmix.config.schema import TRAIN, check_train_config, untyped_keys
from tests.helpers import run_config


def build_for_dry_run(cfg) -> torch.nn.Module:
    """The model `python train.py <overrides> dry_run=true` builds and counts (shapes only: on the meta device)."""
    settle_mixer_choice(cfg)
    check_train_config(cfg)  # train.py checks the schema before dry_run
    assert untyped_keys(cfg, TRAIN) == []  # each key typed, or named as read where it is used
    with torch.device("meta"):
        return model_from_config(cfg)


register_resolvers()

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
RECORDED = json.loads((FIXTURES / "experiment_parameters.json").read_text())
CKPT = FIXTURES / "old_tree_tiny.ckpt"
CKPT_PARAMETERS = 42688  # what the old tree's train.py and generate.py reported for it
# Sizes changed on purpose since the old tree, each with the overrides that restore the old model: the IWSLT presets
# got their own output projection (Wu 2019 and Lioutas 2020 count 43M/42M, which a tied projection cannot reach); the
# NAT CPU recipes build their encoder as the teacher's (sinusoidal positions) so that it can start from it; the
# DialogSum Transformer recipe is pre-norm (post-norm learned summaries that ignore the dialogue).
UNTIED = ["model.share_decoder_input_output_embed=true"]
NAT_AS_PAPER = ["model.positions=learned", "model.scale_embedding=false", "model.encoder.activation=gelu"]
POST_NORM = ["model.encoder.normalize_before=false", "model.decoder.normalize_before=false"]
CHANGED_ON_PURPOSE = {
    "dialogsum_transformer_cpu": POST_NORM,
    "wu2019_iwslt14_deen": UNTIED,
    "lioutas2020_talk_iwslt14_deen": UNTIED,
    "multi30k_disco_cpu": NAT_AS_PAPER,
    "multi30k_cmlm_cpu": NAT_AS_PAPER,
}


def compose_train(overrides: list[str]):
    """train.yaml composed as train.py composes it, with the hydra node made current (settle_mixer_choice reads it)."""
    return run_config(overrides, keep_hydra=True)


def distinct_parameters(model: torch.nn.Module) -> int:
    """seqmix's count_parameters: tied parameters count once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


@pytest.mark.parametrize("entry", sorted(RECORDED["experiments"]))
def test_experiment_builds_the_old_trees_model_size(entry):
    """`<experiment> [ablation/<table>=<row>]`: `python train.py experiment=<experiment> [...] dry_run=true`."""
    experiment, *overrides = entry.split()
    restore = CHANGED_ON_PURPOSE.get(entry, [])
    cfg = compose_train([f"experiment={experiment}", *overrides, *restore, "dry_run=true"])
    assert distinct_parameters(build_for_dry_run(cfg)) == RECORDED["experiments"][entry]


@pytest.mark.parametrize("entry", sorted(CHANGED_ON_PURPOSE))
def test_changes_since_the_old_tree_are_real_and_only_what_they_say(entry):
    """Without the restoring overrides the size differs by exactly what the change says: one untied vocab x embed
    projection, the final layer norms a pre-norm stack adds, or the learned position tables that sinusoidal positions
    drop."""
    experiment, *overrides = entry.split()
    model = build_for_dry_run(compose_train([f"experiment={experiment}", *overrides, "dry_run=true"]))
    difference = distinct_parameters(model) - RECORDED["experiments"][entry]
    if CHANGED_ON_PURPOSE[entry] is UNTIED:
        projection = model.output_projection.weight
        assert projection is not model.decoder.embed_tokens.weight
        assert difference == projection.numel()
    elif CHANGED_ON_PURPOSE[entry] is POST_NORM:
        final_norms = [side.layer_norm for side in (model.encoder, model.decoder)]
        assert all(final_norms) and difference == sum(p.numel() for n in final_norms for p in n.parameters())
    else:
        old = build_for_dry_run(compose_train([f"experiment={experiment}", *overrides, *CHANGED_ON_PURPOSE[entry],
                                               "dry_run=true"]))
        learned = sum(p.numel() for side in (old.encoder, old.decoder) for p in side.embed_positions.parameters())
        assert learned > 0 and difference == -learned


def test_every_experiment_has_a_recorded_size():
    """A renamed or dropped experiment file is a decision to make here, not a silently shorter list."""
    recorded = {e.split()[0] for e in (*RECORDED["experiments"], *RECORDED["skipped"])}
    assert recorded == {p.stem for p in (CONF / "experiment").glob("*.yaml")}


@pytest.mark.parametrize("beam_size,expected", [(4, "old_tree_tiny.beam4.txt"), (1, "old_tree_tiny.greedy.txt")],
                         ids=["beam4", "greedy"])
def test_old_checkpoint_decodes_as_it_did(beam_size, expected, tmp_path):
    out = tmp_path / "hyp.txt"
    env = {**os.environ, "SEQMIX_LOG_DIR": str(tmp_path / "logs"), "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, "generate.py", f"ckpt_path={CKPT}", f"input={FIXTURES / 'old_tree_tiny.input.txt'}",
         f"beam_size={beam_size}", "device=cpu", f"output={out}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"({CKPT_PARAMETERS:,} parameters)" in proc.stdout, proc.stdout
    assert out.read_text().splitlines() == (FIXTURES / expected).read_text().splitlines()
