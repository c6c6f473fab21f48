"""The paper ablations as sweeps: each row of conf/ablation composes to the settings its paper's table describes
(each row adding one change to the row before it), and the experiment sweeps the rows in the table's order."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from tests.helpers import ROOT

CONV = {"glu": False, "weight_softmax": False, "weight_dropout": 0.0, "num_heads": 256, "kernel_size": 3}
WU2019 = [  # Table 3, top to bottom: (row, mixer class, settings of both sides' mixers)
    ("self_attention", "SelfAttention", {}),
    ("depthwise_k3", "LightConv", CONV),
    ("increasing_kernels", "LightConv", {**CONV, "kernel_size": [3, 7, 15]}),
    ("dropconnect", "LightConv", {**CONV, "kernel_size": [3, 7, 15], "weight_dropout": 0.1}),
    ("weight_sharing", "LightConv", {**CONV, "kernel_size": [3, 7, 15], "weight_dropout": 0.1, "num_heads": 4}),
    ("lightconv", "LightConv", {"glu": False, "weight_softmax": True, "weight_dropout": 0.1, "num_heads": 4,
                                "kernel_size": [3, 7, 15]}),
    ("dynamicconv", "DynamicConv", {"glu": False, "weight_softmax": True, "weight_dropout": 0.1, "num_heads": 4,
                                    "kernel_size": [3, 7, 15]}),
    ("dynamicconv_no_softmax", "DynamicConv", {"glu": False, "weight_softmax": False, "num_heads": 4}),
    ("dynamicconv_glu", "DynamicConv", {"glu": True, "weight_softmax": True, "num_heads": 4}),
]
TALK = {"kernel_size": 1, "num_heads": 1, "offset_dropout": 0.0, "input_dropout": 0.0, "output_normalization": False}
LIOUTAS2020 = [  # Table 7: (row, settings of both sides' mixers, FFN activation)
    ("unnormalized", TALK, "swish"),
    ("output_normalization", {**TALK, "output_normalization": True}, "swish"),
    ("increasing_offsets", {**TALK, "output_normalization": True, "kernel_size": [1, 3, 7]}, "swish"),
    ("offset_dropout", {**TALK, "output_normalization": True, "kernel_size": [1, 3, 7], "offset_dropout": 0.1},
     "swish"),
    ("fully_headed", {"output_normalization": True, "kernel_size": [1, 3, 7], "offset_dropout": 0.1,
                      "num_heads": 256}, "swish"),
    ("multi_headed", {"output_normalization": True, "num_heads": 4, "offset_dropout": 0.1}, "swish"),
    ("relu", {"output_normalization": True, "num_heads": 4, "offset_dropout": 0.1}, "relu"),
]


def composed(experiment: str, group: str, row: str):
    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        return compose("train", overrides=[f"experiment={experiment}", f"{group}={row}"], return_hydra_config=True)


def sides(cfg):
    return [OmegaConf.to_container(cfg.model[side], resolve=True) for side in ("encoder", "decoder")]


@pytest.mark.parametrize("row,mixer,settings", WU2019, ids=[r[0] for r in WU2019])
def test_wu2019_table3_rows(row, mixer, settings):
    cfg = composed("wu2019_ablation_multi30k", "ablation/wu2019_table3", row)
    for side in sides(cfg):
        assert side["mixer"]["_target_"] == f"seqmix.mixers.{mixer}"
        assert {k: side["mixer"][k] for k in settings} == settings
        assert side["layers"] == 3 and side["activation"] == "relu"
    assert cfg.model.embed_dim == 256 and cfg.trainer.max_steps == 250 and not cfg.run_test


@pytest.mark.parametrize("row,settings,activation", LIOUTAS2020, ids=[r[0] for r in LIOUTAS2020])
def test_lioutas2020_table7_rows(row, settings, activation):
    cfg = composed("lioutas2020_ablation_multi30k", "ablation/lioutas2020_table7", row)
    for side in sides(cfg):
        assert side["mixer"]["_target_"] == "seqmix.mixers.TaLK"
        assert {k: side["mixer"][k] for k in settings} == settings
        assert side["activation"] == activation


@pytest.mark.parametrize("experiment,group,rows", [
    ("wu2019_ablation_multi30k", "ablation/wu2019_table3", [r[0] for r in WU2019]),
    ("lioutas2020_ablation_multi30k", "ablation/lioutas2020_table7", [r[0] for r in LIOUTAS2020])])
def test_the_experiment_sweeps_every_row_in_the_table_order(experiment, group, rows):
    cfg = composed(experiment, group, rows[0])
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.hydra.sweeper.params[group].split(",") == rows
    assert sorted(p.stem for p in (ROOT / "conf" / group).glob("*.yaml")) == sorted(rows)
