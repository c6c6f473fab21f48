"""The config schema (seqmix.config.schema): every shipped config passes it, and a wrong type or range is refused at
composition naming the key, the value and what is allowed."""

from __future__ import annotations

import math

import pytest
from hydra import compose, initialize_config_dir

from seqmix.config.mixer_group import settle_mixer_choice
from seqmix.config.schema import (
    COUNT,
    GENERATE,
    PROBABILITY,
    TRAIN,
    AnyOf,
    Choice,
    ListOf,
    Number,
    Text,
    check_generate_config,
    check_train_config,
    untyped_keys,
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
    ("task.bleu.tokenize=moses", "task.bleu.tokenize='moses': must be one of ['none', 'zh', '13a'"),
    ("task.bleu.paper=multi_bleu", "task.bleu.paper='multi_bleu': must be one of ['tokenized', 'tokenized_lowercase', "
                                   "'compound_split'] or a list of non-empty items"),
    ("task.bleu.paper=[tokenized,compound_split]", None),
    ("+task.data.source.remove_bpe=@@", "task.data.source.remove_bpe='@@': must be a BPE continuation marker and its "
                                        "space, e.g. '@@ ' or one of [None]"),
    ("+task.data.tokenizer.kind=sentencepiece", "task.data.tokenizer.kind='sentencepiece': must be one of ['bpe', 'word']"),
    ("task.data.tokenizer.vocab_size=0", "task.data.tokenizer.vocab_size=0: must be a whole number >= 1"),
    ("task.data.source.src_lang=''", "task.data.source.src_lang='': must be a non-empty string"),
    ("task.data.splits.train=null", "task.data.splits.train=None: must be a non-empty string"),
    ("+task.monitor.mode=maximum", "task.monitor.mode='maximum': must be one of ['min', 'max']"),
    ("callbacks.best_checkpoint.save_top_k=-2", "callbacks.best_checkpoint.save_top_k=-2: must be a whole number >= -1"),
    ("callbacks.last_checkpoint.every_n_updates=1.5", "callbacks.last_checkpoint.every_n_updates=1.5: must be a whole"),
    ("save_interval_updates=-5", "save_interval_updates=-5: must be a whole number >= 0"),
    ("keep_interval_updates=0", "keep_interval_updates=0: must be -1 (keep all) or a whole number >= 1"),
    ("keep_interval_updates=-1", None),
    ("callbacks.dashboard.samples=-1", "callbacks.dashboard.samples=-1: must be a whole number >= 0"),
    ("callbacks.lr_monitor.logging_interval=batch", "callbacks.lr_monitor.logging_interval='batch': must be one of"),
    ("logger.wandb.offline=perhaps", "logger.wandb.offline='perhaps': must be true or false"),
    ("logger.wandb.project=''", "logger.wandb.project='': must be a non-empty string"),
    ("trainer.max_time=45min", "trainer.max_time='45min': must be a duration DD:HH:MM:SS or one of [None]"),
    ("trainer.max_time=00:00:45:00", None),
    ("+trainer.max_time={minutes:-5}", "trainer.max_time.minutes=-5: must be a finite number >= 0"),
    ("model.encoder.activation=tanh", "model.encoder.activation='tanh': must be one of ['relu', 'swish', 'gelu']"),
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
    ("average_updates=yes", "average_updates='yes': must be true or false"),
    ("algorithm=greedy", "algorithm='greedy': must be one of ['easy_first', 'mask_predict'] or one of [None]"),
    ("+data.path=''", "data.path='': must be a non-empty string"),
    ("input=''", "input='': must be a non-empty string or one of [None]"),
    ("paper_bleu=bleu", "paper_bleu='bleu': must be one of ['tokenized', 'tokenized_lowercase', 'compound_split']"),
    ("score_reference=yes", "score_reference='yes': must be true or false"),
    ("ckpt_path=[]", "ckpt_path=[]: must be a non-empty string or a list of non-empty items, each a non-empty string"),
    ("ckpt_path=[a.ckpt,3]", "ckpt_path=['a.ckpt', 3]: must be a non-empty string or a list of non-empty items"),
])
def test_a_wrong_generate_value_is_refused(override, message):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="generate", overrides=["ckpt_path=x.ckpt", override], return_hydra_config=True)
    resolve_outside_hydra(cfg)
    with pytest.raises(SeqmixError) as info:
        check_generate_config(cfg)
    assert str(info.value).startswith(message), str(info.value)


def test_a_wrong_value_in_a_group_option_is_refused():
    for overrides, message in [
        (["scheduler=reduce_on_plateau", "scheduler.factor=1.0"], "scheduler.factor=1.0: must be a finite number > 0 and < 1"),
        (["optim=nag", "optim.nesterov=1"], "optim.nesterov=1: must be true or false"),
        (["task=wikitext2", "task.data.break_mode=line"], "task.data.break_mode='line': must be one of ['none', 'eos']"),
        (["logger=csv", "logger.csv.name=''"], "logger.csv.name='': must be a non-empty string"),
        (["experiment=multi30k_hybrid_cpu", "model.encoder.legend.L.kernel_size=[3,0]"],
         "model.encoder.legend.L.kernel_size=[3, 0]: must be a whole number >= 1 or a list of items, each a whole"),
    ]:
        with pytest.raises(SeqmixError) as info:
            check_train_config(train_config([*overrides, "paths.output_dir=/tmp/run"]))
        assert str(info.value).startswith(message), str(info.value)


GROUP_OPTIONS = [f"{group}={p.stem}" for group in ("logger", "debug", "scheduler", "optim", "trainer", "callbacks")
                 for p in sorted((CONF / group).glob("*.yaml"))]


@pytest.mark.parametrize("option", GROUP_OPTIONS)
def test_every_key_of_every_group_option_is_typed_or_named_as_read_where_used(option):
    """A new config key needs a schema rule (or an entry in READ_WHERE_USED saying who checks it): the options of the
    groups that neither tests/test_configs.py (model x task) nor tests/test_old_tree_compat.py (experiments) vary."""
    cfg = train_config([option, "paths.output_dir=/tmp/run"])
    check_train_config(cfg)
    assert untyped_keys(cfg, TRAIN) == []


def test_every_key_of_the_generate_config_is_typed():
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="generate", overrides=["ckpt_path=x.ckpt"], return_hydra_config=True)
    resolve_outside_hydra(cfg)
    check_generate_config(cfg)
    assert untyped_keys(cfg, GENERATE) == []


def test_the_rules_themselves():
    assert Number(0, 1, open_high=True).problem(1) and not PROBABILITY.problem(0.0) and PROBABILITY.problem(True)
    assert COUNT.problem(1.0) and not COUNT.problem(3) and COUNT.problem(math.nan)
    assert not Choice(("a",)).problem("a") and Choice((1,)).problem(True)  # True is not 1 here
    assert not AnyOf((COUNT, Choice((None,)))).problem(None) and ListOf(COUNT).problem([1, 0])
    assert ListOf(COUNT, length=2).problem([1]) == "must be a list of 2 items, each a whole number >= 1"
    assert Text(r"\d+", "digits").problem("12a") == "must be digits" and not Text(r"\d+", "digits").problem("12")
