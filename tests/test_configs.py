"""Every model × task composes and instantiates; experiments and the SLURM launcher compose."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from seqmix.config.build import build_model, model_from_config
from seqmix.config.mixer_group import mixer_class, mixer_names
from seqmix.config.resolvers import register_resolvers
from seqmix.config.schema import TRAIN, check_train_config, untyped_keys
from seqmix.config.user_errors import user_error_in
from seqmix.errors import SeqmixError
from seqmix.models import DecoderOnly, count_parameters

CONF = Path(__file__).resolve().parents[1] / "conf"
TEST_MIXER_CONF = Path(__file__).resolve().parent / "mixers" / "conf"
register_resolvers()


def names(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_train(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=True)


def resolve_outside_hydra(cfg):
    """compose() leaves ${hydra:...} unresolvable outside a run; pin the output dir for instantiation."""
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(cfg)
    return cfg


@pytest.mark.parametrize("task", names("task"))
@pytest.mark.parametrize("model", names("model"))
def test_model_task_compose_and_instantiate(task, model):
    cfg = resolve_outside_hydra(compose_train([f"task={task}", f"model={model}", "task.vocab_size=320"]))
    check_train_config(cfg)  # every shipped model x task passes the schema (seqmix.config.schema)
    assert untyped_keys(cfg, TRAIN) == []  # and each of its keys is typed or named as read where used
    lm = cfg.task.get("adaptive") is not None
    vocab = max([320, *[c + 100 for c in (cfg.task.adaptive.cutoffs if lm else [])]])  # above adaptive cutoffs
    if lm and model.startswith(("convs2s", "cmlm", "disco")):  # no language model in these presets
        with pytest.raises(SeqmixError, match="language modeling needs a preset|not parallel data"):
            build_model(cfg, vocab, padding_idx=1)
        return
    with torch.device("meta"):
        net = build_model(cfg, vocab, padding_idx=1)
    assert count_parameters(net) > 0 and type(net).__name__ == ("DecoderOnly" if lm else cfg.model._target_.split(".")[-1])
    dm = instantiate(cfg.task.data, _convert_="all")
    assert dm is not None and hasattr(dm, "setup")
    factory = instantiate(cfg.task.module)
    assert callable(factory)
    for key in ("optim", "scheduler"):
        assert callable(instantiate(cfg[key]))
    OmegaConf.to_container(cfg.trainer, resolve=True)
    OmegaConf.to_container(cfg.callbacks, resolve=True)


LM_TASKS = ["lm1b", "wikitext103", "wikitext2"]


@pytest.mark.parametrize("task", LM_TASKS)
@pytest.mark.parametrize("mixer", mixer_names())
def test_language_models_of_every_mixer(task, mixer):
    """task= switches the family, mixer= the mixer: the LM tasks build the preset's decoder stack alone, pre-norm
    where the mixer says its language models need it."""
    cfg = resolve_outside_hydra(compose_train([f"task={task}", "model=transformer_small", f"mixer={mixer}"]))
    with torch.device("meta"):
        net = model_from_config(cfg)
    assert isinstance(net, DecoderOnly) and len(net.decoder.layers) == cfg.model.decoder.layers
    assert all(type(b.mixer) is mixer_class(mixer) and b.cross_attn is None and b.mixer.causal
               for b in net.decoder.layers)
    pre_norm = mixer_class(mixer).language_model_pre_norm or cfg.model.decoder.normalize_before
    assert all(b.mixer_residual.normalize_before == pre_norm for b in net.decoder.layers)
    assert pre_norm == (mixer != "self_attention")  # the conv mixers' LMs diverge post-norm
    adaptive = cfg.task.adaptive
    assert len(net.output.bands) == 1 + (len(adaptive.cutoffs) if adaptive.softmax else 0)


@pytest.mark.parametrize("mixer", mixer_names())
def test_every_mixer_of_the_group_swaps_every_layer(mixer, capsys):
    """python train.py model=transformer mixer=<m> task=multi30k_ende dry_run=true; causality from the side."""
    cfg = resolve_outside_hydra(compose_train(["model=transformer", f"mixer={mixer}", "task=multi30k_ende",
                                               "dry_run=true"]))
    net = build_model(cfg, 320, padding_idx=1)
    for stack, causal in ((net.encoder, False), (net.decoder, True)):
        assert [(type(b.mixer), b.mixer.causal) for b in stack.layers] == [(mixer_class(mixer), causal)] * 6


@pytest.mark.parametrize("preset,overrides", [
    ("dynamicconv", ["model=transformer", "mixer=dynamicconv", "model.encoder.layers=7"]),
    ("lightconv", ["model=dynamicconv", "mixer=lightconv"]),
    ("talk", ["model=transformer", "mixer=talk", "model.encoder.layers=7"]),
    ("lightconv_small", ["model=transformer_small", "mixer=lightconv"]),
])
def test_a_mixer_preset_is_the_backbone_plus_its_mixer(preset, overrides):
    """model=dynamicconv and model=transformer mixer=dynamicconv (with the preset's depth) are the same model."""
    def shapes(args):
        cfg = resolve_outside_hydra(compose_train(args))
        return {k: tuple(v.shape) for k, v in build_model(cfg, 320, padding_idx=1).state_dict().items()}

    assert shapes([f"model={preset}"]) == shapes(overrides)


def test_one_side_takes_its_own_mixer():
    cfg = resolve_outside_hydra(compose_train(["model=transformer_small", "mixer@model.encoder.mixer=dynamicconv",
                                               "model.encoder.mixer.kernel_size=5"]))
    net = build_model(cfg, 320, padding_idx=1)
    assert {(type(b.mixer).__name__, b.mixer.kernel_size) for b in net.encoder.layers} == {("DynamicConv", 5)}
    assert {type(b.mixer).__name__ for b in net.decoder.layers} == {"SelfAttention"}


def test_a_mixer_registered_by_config_alone_joins_the_group():
    """A config folder on hydra.searchpath adds its mixer/ files to the group, as mixer_names(extra) lists them."""
    cfg = resolve_outside_hydra(compose_train([f"hydra.searchpath=[file://{TEST_MIXER_CONF}]", "mixer=ema"]))
    net = build_model(cfg, 320, padding_idx=1)
    assert {type(b.mixer).__name__ for s in (net.encoder, net.decoder) for b in s.layers} == {"EMAMixer"}
    assert "ema" in mixer_names([TEST_MIXER_CONF]) and "ema" not in mixer_names()


@pytest.mark.parametrize("model", ["convs2s", "convs2s_small"])
def test_language_model_needs_a_mixer_preset(model):
    cfg = resolve_outside_hydra(compose_train(["task=wikitext2", f"model={model}"]))
    with pytest.raises(SeqmixError, match="no decoder.mixer"):
        model_from_config(cfg)


# The papers' parameter counts (Wu et al. 2019 Tables 4-5; Lioutas & Guo 2020 Tables 4-5), rounded to 1M there.
PAPER_COUNTS = {
    "wu2019_dynamicconv_lm_gbw": 339e6,
    "lioutas2020_talk_wikitext103": 240e6,
    "lioutas2020_talk_cnndm_standard": 59e6,
    "lioutas2020_talk_cnndm_deep": 83e6,
    "wu2019_cnndm mixer=lightconv": 86e6,
    "wu2019_cnndm": 87e6,
}


@pytest.mark.parametrize("experiment", sorted(PAPER_COUNTS))
def test_lm_and_summarization_presets_match_the_papers_sizes(experiment, capsys):
    name, *overrides = experiment.split()
    cfg = resolve_outside_hydra(compose_train([f"experiment={name}", *overrides, "dry_run=true"]))
    with torch.device("meta"):
        n = count_parameters(model_from_config(cfg))
    assert abs(n - PAPER_COUNTS[experiment]) / PAPER_COUNTS[experiment] < 0.01, n


def test_one_paper_preset_for_both_convolutions():
    """Wu et al. 2019 Table 1 (WMT En-De big, 32K joint BPE): DynamicConv has 213M parameters; mixer=lightconv
    changes only the convolutions' taps (fixed (H, K) weights instead of the Linear predicting them)."""
    def build(mixer):
        cfg = resolve_outside_hydra(compose_train(["experiment=wu2019_wmt_ende_big", f"mixer={mixer}",
                                                   "task.vocab_size=32768"]))
        with torch.device("meta"):
            return build_model(cfg, 32768, padding_idx=1)

    dynamic, light = build("dynamicconv"), build("lightconv")
    assert abs(count_parameters(dynamic) - 213e6) / 213e6 < 0.01, count_parameters(dynamic)
    d = {k: v.shape for k, v in dynamic.state_dict().items()}
    s = {k: v.shape for k, v in light.state_dict().items()}
    assert {k for k in d if k not in s} == {k for k in d if ".conv.weight_linear." in k} != set()
    assert {k for k in s if k not in d} == {k for k in s if k.endswith(".conv.weight")} != set()
    assert all(d[k] == s[k] for k in d.keys() & s.keys())


def test_transformer_big_has_about_210m_parameters():
    cfg = resolve_outside_hydra(compose_train(["experiment=vaswani2017_transformer_big_wmt_ende",
                                               "task.vocab_size=32768"]))
    n = count_parameters(build_model(cfg, 32768, padding_idx=1))
    assert abs(n - 210e6) / 210e6 < 0.01, n


def test_slurm_launcher_composes_consistent_with_trainer():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = compose_train(["hydra/launcher=slurm", "trainer.devices=4", "trainer.num_nodes=2"])
    launcher = cfg.hydra.launcher
    assert "submitit" in launcher._target_.lower()
    assert launcher.tasks_per_node == 4 and launcher.nodes == 2 and launcher.gpus_per_node == 4


@pytest.mark.parametrize("group,choice", [("model", "no_such_model"), ("task", "no_such_task")])
def test_unknown_choice_names_the_options(group, choice):
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException, match="Available options"):
        compose_train([f"{group}={choice}"])


def test_adam_decays_weights_decoupled_like_fairseq():
    """optim=adam with weight_decay shrinks a weight by lr * wd per step (fairseq's Adam = AdamW). Adam with L2
    would normalize the decay gradient and shrink a row that gets no data gradient by ~lr per step."""
    cfg = compose_train(["optim.lr=0.1", "optim.weight_decay=0.01"])
    rows = torch.nn.Parameter(torch.ones(2, 4))
    optimizer = instantiate(cfg.optim)([rows])
    for _ in range(3):
        optimizer.zero_grad()
        (rows[0].sum() * 0.0 + (rows[1] ** 2).sum()).backward()  # row 0: zero gradient, row 1: some gradient
        optimizer.step()
    torch.testing.assert_close(rows[0].detach(), torch.full((4,), (1 - 0.1 * 0.01) ** 3))


@pytest.mark.parametrize("override,horizon", [([], 40), (["scheduler.total_updates=10"], 10)])
def test_cosine_horizon_is_the_trainer_estimate_unless_the_config_sets_it(override, horizon):
    from seqmix.tasks.base import make_scheduler

    cfg = compose_train(["scheduler=cosine", "scheduler.warmup_updates=0", "scheduler.min_lr=0", *override])
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = make_scheduler(instantiate(cfg.scheduler), optimizer, lambda: 40)
    lrs = []
    for _ in range(horizon + 1):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(1.0) and lrs[horizon // 2] == pytest.approx(0.5) and lrs[horizon] == pytest.approx(0.0)


def test_a_top_level_mixer_option_is_an_error_not_a_silent_no_op():
    from seqmix.config.mixer_group import settle_mixer_choice

    cfg = resolve_outside_hydra(compose_train(["mixer=dynamicconv", "mixer.kernel_size=[5]"]))
    with pytest.raises(SeqmixError, match="model.encoder.mixer.kernel_size=... and/or model.decoder.mixer"):
        settle_mixer_choice(cfg)
    cfg = resolve_outside_hydra(compose_train(["mixer=dynamicconv", "model.decoder.mixer.kernel_size=[5]"]))
    settle_mixer_choice(cfg)
    assert "mixer" not in cfg and cfg.model.decoder.mixer.kernel_size == [5]


def test_an_option_of_another_mixer_is_a_clear_error():
    """A recipe's self-attention dropout left on a swapped-in convolution names the option, not a Hydra trace."""
    cfg = resolve_outside_hydra(compose_train(["experiment=multi30k_transformer_cpu", "mixer=dynamicconv"]))
    with pytest.raises(Exception) as info:
        build_model(cfg, 320, padding_idx=1)
    assert "DynamicConv does not take ['attention_dropout']" in user_error_in(info.value)[1]


@pytest.mark.parametrize("caps, precision", [({"avx2": True}, "32-true"), ({"avx512_bf16": True}, "bf16-mixed"),
                                             ({"amx_bf16": True, "avx512_bf16": False}, "bf16-mixed")])
@pytest.mark.parametrize("recipe", [r for r in names("experiment") if r.endswith("_cpu")])
def test_cpu_recipes_train_in_bf16_only_where_the_cpu_multiplies_bf16(recipe, caps, precision, monkeypatch):
    """Emulated bf16 (AVX2 only) is several times slower than fp32, native bf16 (AVX512-BF16, AMX) faster; every CPU
    recipe (translation, NAT, language model, summary) chooses the same way."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    assert compose_train([f"experiment={recipe}"]).trainer.precision == precision
    assert compose_train([f"experiment={recipe}", "trainer.precision=32-true"]).trainer.precision == "32-true"


@pytest.mark.parametrize("recipe", [r for r in names("experiment") if r.startswith("wikitext2_") and r.endswith("_cpu")])
def test_language_model_recipes_train_under_bf16_autocast(recipe):
    """The recipe's own model (adaptive input and softmax, its mixer) takes a bf16-mixed step on a batch whose words
    fall in every band, as on an AVX512-BF16 CPU: the adaptive input once failed here at the first batch."""
    cfg = resolve_outside_hydra(compose_train([f"experiment={recipe}", "trainer.precision=bf16-mixed"]))
    cutoffs = list(cfg.task.adaptive.cutoffs)
    assert cfg.task.adaptive.input and len(cutoffs) >= 1  # the banded case the test is about
    torch.manual_seed(0)
    net = build_model(cfg, cutoffs[-1] + 50, padding_idx=1)
    tokens = torch.tensor([[5, cutoffs[0] + 3, cutoffs[-1] + 7, 9, 2, 4], [cutoffs[0] + 1] * 6])
    target = tokens.roll(-1, dims=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        nll = net.nll(net(tokens), target)
        alone = net.eval().nll(net(tokens[1:]), target[1:])
        both = net.nll(net(tokens), target)
    net.train()
    nll.sum().backward()
    assert torch.isfinite(nll).all() and nll.dtype == torch.float32
    assert torch.allclose(both[1:], alone, atol=1e-5)  # a sentence alone as in the batch, whatever the other's words
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)


def test_time_limited_cpu_recipes_validate_the_weights_they_stop_with(tmp_path):
    """The 45-minute recipes validate every N batches across epochs, and Lightning then also validates when the time
    limit stops training mid-epoch (with validation every k epochs it does not, and best.ckpt stays older)."""
    import lightning as L

    class Stop(L.Callback):  # what max_time does (Lightning's Timer), here after update 17
        def on_train_batch_end(self, trainer, *args):
            trainer.should_stop = trainer.global_step == 17

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w, self.validated = torch.nn.Parameter(torch.ones(2)), []

        def training_step(self, batch, batch_idx):
            return (self.w * batch).sum() ** 2

        def validation_step(self, batch, batch_idx):
            self.validated.append(self.global_step)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    def validated(check_val_every_n_epoch, val_check_interval) -> list[int]:
        model, data = Model(), torch.utils.data.DataLoader(torch.randn(4, 2), batch_size=1)  # 4 batches an epoch
        trainer = L.Trainer(max_epochs=50, logger=False, enable_progress_bar=False, enable_checkpointing=False,
                            enable_model_summary=False, num_sanity_val_steps=0, callbacks=[Stop()],
                            default_root_dir=str(tmp_path), check_val_every_n_epoch=check_val_every_n_epoch,
                            val_check_interval=val_check_interval)
        trainer.fit(model, data, torch.utils.data.DataLoader(torch.randn(1, 2), batch_size=1))
        assert trainer.global_step == 17
        return model.validated

    recipes = sorted(p.stem for p in (CONF / "experiment").glob("*_cpu.yaml"))
    assert {"multi30k_convs2s_cpu", "multi30k_disco_cpu", "wikitext2_talk_cpu", "dialogsum_lightconv_cpu"} <= set(recipes)
    for recipe in recipes:
        trainer = compose_train([f"experiment={recipe}"]).trainer
        assert trainer.max_time and trainer.check_val_every_n_epoch is None, recipe
        assert isinstance(trainer.val_check_interval, int) and trainer.val_check_interval >= 200, recipe
    assert validated(None, 6) == [6, 12, 17]  # the recipes' setting, scaled down: the stopping weights validated
    assert validated(3, None) == [12]  # every 3rd epoch (the old recipes): updates 13-17 never validated
