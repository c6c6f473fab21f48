"""The config schema (seqmix.config.schema): every shipped config passes it, and a wrong type or range is refused at
composition naming the key, the value and what is allowed."""

from __future__ import annotations

import math

import pytest
from hydra import compose, initialize_config_dir

from seqmix.config.mixer_group import settle_mixer_choice
from seqmix.config.schema import (
    COUNT,
    PROBABILITY,
    AnyOf,
    Choice,
    ListOf,
    Number,
    check_generate_config,
    check_train_config,
)
from seqmix.errors import SeqmixError
from tests.test_configs import CONF, compose_train, resolve_outside_hydra


def train_config(overrides: list[str]):
    cfg = resolve_outside_hydra(compose_train(overrides))
    settle_mixer_choice(cfg)
    return cfg


# Every shipped config passes the schema: checked where they are composed already, tests/test_old_tree_compat.py
# (every experiment and ablation row) and tests/test_configs.py (every model x task).


@pytest.mark.parametrize("override,message", [
    ("optim.lr=abc", "optim.lr='abc': must be a finite number > 0"),
    ("optim.lr=0", "optim.lr=0: must be a finite number > 0"),
    ("optim.lr=inf", "optim.lr=inf: must be a finite number > 0"),
    ("seed=-1", "seed=-1: must be a whole number >= 0 and <= 4.29497e+09"),
    ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches=0: must be a whole number >= 1"),
    ("model.encoder.layers=-2", "model.encoder.layers=-2: must be a whole number >= 1 or a list"),
    ("trainer.gradient_clip_val=-1", "trainer.gradient_clip_val=-1: must be a finite number >= 0 or one of [None]"),
    ("tags=5", "tags=5: must be a list of items, each a non-empty string"),
    ("label_smoothing=1.5", "label_smoothing=1.5: must be a finite number >= 0 and < 1"),
    ("task.generation.len_penalty=nan", "task.generation.len_penalty=nan: must be a finite number"),
    ("model.dropout=2", "model.dropout=2: must be a finite number >= 0 and < 1"),
    ("model.encoder.mixer.attention_dropout=-0.1", "model.encoder.mixer.attention_dropout=-0.1: must be"),
    ("resume=sometimes", "resume='sometimes': must be one of ['auto', 'never']"),
    ("compile=yes", "compile='yes': must be true or false or one of ['auto']"),
    ("trainer.val_check_interval=0", "trainer.val_check_interval=0: must be"),
    ("task.data.max_tokens=0", "task.data.max_tokens=0: must be a whole number >= 1"),
    ("optim.betas=[0.9]", "optim.betas=[0.9]: must be a list of 2 items"),
    ("model.positions=rotary", "model.positions='rotary': must be one of ['sinusoidal', 'learned']"),
    ("dry_run=maybe", "dry_run='maybe': must be true or false"),
    ("trainer.precision=fp16", "trainer.precision='fp16': must be one of ['32-true', 'bf16-mixed', '16-mixed'"),
    ("trainer.accelerator=gpus", "trainer.accelerator='gpus': must be one of ['auto', 'cpu', 'gpu'"),
    ("trainer.devices=0", "trainer.devices=0: must be a whole number >= 1 or one of ['auto', -1] or a list"),
    ("trainer.devices=[]", "trainer.devices=[]: must be a whole number >= 1 or one of ['auto', -1] or a list of non-empty"),
    ("model.decoder.mixer.attention_dropout=0.1", None),  # allowed: a control case for the mixer keys below
    ("+model.encoder.mixer.glu=maybe", "model.encoder.mixer.glu='maybe': must be true or false"),
])
def test_a_wrong_train_value_is_refused_naming_key_value_and_what_is_allowed(override, message):
    cfg = train_config(["experiment=multi30k_transformer_cpu", override])
    if message is None:
        check_train_config(cfg)
        return
    with pytest.raises(SeqmixError) as info:
        check_train_config(cfg)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("override,message", [
    ("len_penalty=nan", "len_penalty=nan: must be a finite number or one of [None]"),
    ("beam_size=0", "beam_size=0: must be a whole number >= 1"),
    ("max_tokens=-5", "max_tokens=-5: must be a whole number >= 1"),
    ("average_last=two", "average_last='two': must be a whole number >= 0"),
    ("algorithm=greedy", "algorithm='greedy': must be one of ['easy_first', 'mask_predict'] or one of [None]"),
])
def test_a_wrong_generate_value_is_refused(override, message):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="generate", overrides=["ckpt_path=x.ckpt", override], return_hydra_config=True)
    resolve_outside_hydra(cfg)
    with pytest.raises(SeqmixError) as info:
        check_generate_config(cfg)
    assert str(info.value).startswith(message), str(info.value)


def test_the_rules_themselves():
    assert Number(0, 1, open_high=True).problem(1) and not PROBABILITY.problem(0.0) and PROBABILITY.problem(True)
    assert COUNT.problem(1.0) and not COUNT.problem(3) and COUNT.problem(math.nan)
    assert not Choice(("a",)).problem("a") and Choice((1,)).problem(True)  # True is not 1 here
    assert not AnyOf((COUNT, Choice((None,)))).problem(None) and ListOf(COUNT).problem([1, 0])
