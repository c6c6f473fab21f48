"""What every task must provide (abstract hooks) and how the run config's task nodes become option objects."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from seqmix.config.build import from_config
from seqmix.errors import SeqmixError
from seqmix.generation.options import BeamOptions, NATOptions, overridden
from seqmix.metrics import RougeOptions
from seqmix.tasks.base import SeqmixTask

HOOKS = ("compute_loss", "corpus_report", "evaluate_texts")


def task_without(missing: str | None) -> type:
    def hook(*args, **kwargs):
        return None

    body = {name: hook for name in HOOKS if name != missing}
    return type(f"Without_{missing}", (SeqmixTask,), body)


@pytest.mark.parametrize("missing", HOOKS)
def test_a_task_missing_a_hook_cannot_be_constructed(missing):
    with pytest.raises(TypeError, match=missing):
        task_without(missing)(torch.nn.Linear(2, 2), tokenizer=None, optimizer=None)


def test_a_task_with_every_hook_is_constructed():
    task = task_without(None)(torch.nn.Linear(2, 2), tokenizer=None, optimizer=None)
    assert task.run_config == {} and task.reports == {}


def test_task_nodes_become_options_and_unknown_keys_are_user_errors():
    cfg = OmegaConf.create({"task": {"generation": {"beam_size": 4, "len_penalty": 0.6}, "nat": None,
                                     "rouge": {"lead": 1}}})
    assert from_config(cfg, "generation", BeamOptions) == BeamOptions(beam_size=4, len_penalty=0.6)
    assert from_config(cfg, "nat", NATOptions) == NATOptions()  # null: the defaults
    assert from_config(cfg, "rouge", RougeOptions) == RougeOptions(stemming=True, lead=1)
    bad = OmegaConf.create({"task": {"generation": {"beam_size": 4, "beam": 5}}})
    with pytest.raises(SeqmixError, match=r"unknown task.generation keys \['beam'\]"):
        from_config(bad, "generation", BeamOptions)
    with pytest.raises(SeqmixError, match="length_beam=0"):
        from_config(OmegaConf.create({"task": {"nat": {"length_beam": 0}}}), "nat", NATOptions)


def test_overrides_replace_fields_and_none_keeps_them():
    base = BeamOptions(beam_size=4, max_len_b=10)
    assert overridden(base, {"beam_size": 1, "len_penalty": None}, "beam search") == BeamOptions(1, max_len_b=10)
    with pytest.raises(SeqmixError, match=r"\['length_beam'\] do not apply to beam search"):
        overridden(base, {"length_beam": 3}, "beam search")
    with pytest.raises(SeqmixError, match="beam_size must be >= 1"):
        overridden(base, {"beam_size": 0}, "beam search")
