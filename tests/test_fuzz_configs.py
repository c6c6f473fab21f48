"""Property: whatever a user sets, composing and building a run either works or ends in a user error with one
message, never an internal error. Overrides are drawn from the schema's keys (seqmix.config.schema) with values
inside and outside what each rule allows (wrong types, out-of-range numbers, NaN and inf, empty strings, lists
where scalars belong), plus misspelled keys and unknown group choices, on top of the shipped recipes.

`make test` runs a fixed, derandomized sample (FUZZ_EXAMPLES, default 30); `make fuzz` runs 1,000.
"""

from __future__ import annotations

import fnmatch
import os

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from seqmix.config.build import model_from_config
from seqmix.config.mixer_group import settle_mixer_choice
from seqmix.config.schema import TRAIN, check_train_config, leaf_keys
from seqmix.config.user_errors import user_error_in
from seqmix.models import count_parameters
from tests.test_configs import compose_train, resolve_outside_hydra

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "30"))
BASES = ["experiment=multi30k_transformer_cpu", "experiment=multi30k_lightconv_cpu", "experiment=multi30k_talk_cpu",
         "experiment=multi30k_convs2s_cpu", "experiment=multi30k_disco_cpu", "experiment=wikitext2_transformer_cpu",
         "experiment=dialogsum_transformer_cpu", "model=transformer_small"]
WRONG = ["abc", "''", "-1", "0", "-0.5", "1.5", "2", "nan", "inf", "-inf", "1e30", "[1,2]", "true", "null", "3.7"]
CANDIDATES = [1, 2, 3, 4, 8, 0, 0.0, 0.1, 0.5, 0.9, 1e-4, -1, True, False, "auto", "never", "eos", "bos", "learned",
              "sinusoidal", "skip", "raise", "torch", "mask_predict", None, [], ["x"], [0.9, 0.98], [3, 5]]


def override_text(value) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, list):
        return "[" + ",".join(override_text(v) for v in value) + "]"
    return repr(value)


def allowed_values(key: str) -> list:
    """Candidate values every rule of ``key`` allows (a right value for the draw)."""
    rules = [rule for pattern, rule in TRAIN.items() if fnmatch.fnmatchcase(key, pattern)]
    return [v for v in CANDIDATES if not any(rule.problem(v) for rule in rules)]


def schema_keys(base: str) -> list[str]:
    cfg = OmegaConf.to_container(compose_train([base]), resolve=False)
    return sorted(k for k in leaf_keys(cfg) if any(fnmatch.fnmatchcase(k, p) for p in TRAIN) and allowed_values(k))


KEYS = {base: schema_keys(base) for base in BASES}


@st.composite
def runs(draw) -> list[str]:
    base = draw(st.sampled_from(BASES))
    overrides = [base, "task.vocab_size=320"]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["wrong", "right", "right", "right", "typo", "choice"]))
        if kind == "typo":
            overrides.append(draw(st.sampled_from(["optim.lrate=1", "trainer.max_epoch=3", "model.embed_dims=4",
                                                   "task.data.max_token=5"])))
        elif kind == "choice":
            overrides.append(draw(st.sampled_from(["model=transformer_smal", "mixer=nope", "optim=adamw",
                                                   "model=lightconv_small", "mixer=talk", "mixer=dynamicconv",
                                                   "scheduler=cosine", "optim=nag", "scheduler=constant"])))
        else:
            key = draw(st.sampled_from(KEYS[base]))
            value = draw(st.sampled_from(WRONG)) if kind == "wrong" else \
                override_text(draw(st.sampled_from(allowed_values(key))))
            overrides.append(f"{key}={value}")
    return overrides


def build(overrides: list[str]) -> int:
    cfg = resolve_outside_hydra(compose_train(overrides))
    settle_mixer_choice(cfg)
    check_train_config(cfg)
    with torch.device("meta"):
        return count_parameters(model_from_config(cfg))


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(runs())
def test_a_run_builds_or_is_one_user_error(overrides):
    try:
        parameters = build(overrides)
    except Exception as raised:  # noqa: BLE001 - the property is about every exception
        found = user_error_in(raised)
        assert found is not None, f"internal error for {overrides}: {type(raised).__name__}: {raised}"
        assert "\n" not in found[1], found[1]
        event(f"user error ({type(found[0]).__name__})")
        return
    assert parameters > 0
    event("builds")
