"""Every model × task composes and instantiates; experiments and the SLURM launcher compose."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from seqmix.cli.common import build_model, count_parameters
from seqmix.cli.resolvers import register_resolvers

CONF = Path(__file__).resolve().parents[1] / "conf"
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
    net = build_model(cfg.model, 320, 320, padding_idx=1)
    assert count_parameters(net) > 0
    dm = instantiate(cfg.task.data, _convert_="all")
    assert dm is not None and hasattr(dm, "setup")
    factory = instantiate(cfg.task.module)
    assert callable(factory)
    for key in ("optim", "scheduler"):
        assert callable(instantiate(cfg[key]))
    OmegaConf.to_container(cfg.trainer, resolve=True)
    OmegaConf.to_container(cfg.callbacks, resolve=True)


@pytest.mark.parametrize("experiment", names("experiment"))
def test_experiments_compose_and_build(experiment):
    cfg = resolve_outside_hydra(compose_train([f"experiment={experiment}"]))
    vocab = int(cfg.task.vocab_size)
    net = build_model(cfg.model, vocab, vocab, padding_idx=1)
    assert count_parameters(net) > 0


def test_transformer_big_has_about_210m_parameters():
    cfg = resolve_outside_hydra(compose_train(["experiment=vaswani2017_transformer_big_wmt_ende",
                                               "task.vocab_size=32768"]))
    n = count_parameters(build_model(cfg.model, 32768, 32768, padding_idx=1))
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
