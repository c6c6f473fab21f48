"""For the benchmark tests: tiny, randomly initialized Multi30k checkpoints (the real recipes' configs, shrunk) that
load through ``seqmix.training.checkpoints.load_task`` (as generate.py does) like trained ones, a tiny val set, and wrong mixers
joined to the mixer group through a config folder, as a plugin's would be."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from seqmix.config.build import build_task, to_container
from seqmix.config.resolvers import register_resolvers
from seqmix.data.tokenizer import train_tokenizer
from seqmix.mixers.base import TokenMixer

CONF = Path(__file__).resolve().parents[1] / "conf"

VAL_EN = ["A man in a blue shirt is standing on a ladder.", "Two dogs play in the snow.",
          "A girl is jumping into a pool.", "People are walking down a busy street.",
          "A child eats an apple.", "A woman rides a bike on the road.", "Three men are playing music.",
          "A black dog runs through the grass.", "A boy in a red jacket sits on a bench.",
          "Two women talk at a table.", "A cat sleeps.", "The workers are building a house near the river."]
VAL_DE = ["Ein Mann in einem blauen Hemd steht auf einer Leiter.", "Zwei Hunde spielen im Schnee.",
          "Ein Mädchen springt in ein Schwimmbecken.", "Leute gehen eine belebte Straße entlang.",
          "Ein Kind isst einen Apfel.", "Eine Frau fährt auf der Straße Fahrrad.", "Drei Männer machen Musik.",
          "Ein schwarzer Hund rennt durch das Gras.", "Ein Junge in einer roten Jacke sitzt auf einer Bank.",
          "Zwei Frauen unterhalten sich an einem Tisch.", "Eine Katze schläft.",
          "Die Arbeiter bauen ein Haus in der Nähe des Flusses."]

TINY_MODEL = ["model.embed_dim=16", "model.encoder.layers=1", "model.decoder.layers=1", "model.encoder.ffn_dim=32",
              "model.decoder.ffn_dim=32", "model.encoder.heads=2", "model.decoder.heads=2",
              "model.decoder.cross_attention_heads=2", "model.max_source_positions=64",
              "model.max_target_positions=64"]


def write_val(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "val.en").write_text("".join(s + "\n" for s in VAL_EN), encoding="utf-8")
    (directory / "val.de").write_text("".join(s + "\n" for s in VAL_DE), encoding="utf-8")
    return directory


def tiny_tokenizer():
    return train_tokenizer(VAL_EN + VAL_DE, vocab_size=200, min_frequency=1)


def save_tiny_checkpoint(path: Path, experiment: str, tokenizer, overrides: list[str] = (), seed: int = 0) -> Path:
    """``experiment``'s run config with a tiny model, random weights, saved as train.py's best.ckpt would be."""
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"experiment={experiment}", "logger=none",
                                                      f"paths.output_dir={path.parent}", *TINY_MODEL, *overrides])
    torch.manual_seed(seed)
    task = build_task(cfg, tokenizer)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {f"model.{k}": v for k, v in task.model.state_dict().items()},
                "seqmix": {"config": to_container(cfg), "tokenizer": tokenizer.to_json(), "format": 1}}, path)
    return path


@pytest.fixture(autouse=True)
def one_thread():
    """Small ops on a shared CPU are many times faster on one thread; restored for the rest of the session.
    Autouse in every test module that imports it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class NaNMixer(TokenMixer):
    """Right shape, wrong numbers: the kind of kernel bug that would otherwise look fast."""

    def __init__(self, embed_dim: int, causal: bool = False, layer_idx: int = 0):
        super().__init__(embed_dim, causal, layer_idx)
        self.proj = torch.nn.Linear(embed_dim, embed_dim)

    def forward(self, x, key_padding_mask=None, state=None):
        return self.proj(x) * float("nan")


class ShortMixer(NaNMixer):
    """Finite numbers, wrong shape (drops the last step)."""

    def forward(self, x, key_padding_mask=None, state=None):
        return self.proj(x)[:, :-1]


class FastPathMixer(NaNMixer):
    """A 'fast kernel' that disagrees with its own PyTorch path (``kernel_backend=torch``)."""

    def __init__(self, embed_dim: int, causal: bool = False, layer_idx: int = 0, kernel_backend: str = "auto"):
        super().__init__(embed_dim, causal, layer_idx)
        self.kernel_backend = kernel_backend

    def forward(self, x, key_padding_mask=None, state=None):
        return self.proj(x) * (1.0 if self.kernel_backend == "torch" else 1.01)


def mixer_conf(directory: Path, **mixers: type) -> Path:
    """A config folder whose ``mixer/<name>.yaml`` adds each class to the mixer group (as a plugin's would)."""
    (directory / "mixer").mkdir(parents=True, exist_ok=True)
    for name, cls in mixers.items():
        (directory / "mixer" / f"{name}.yaml").write_text(f"_target_: {cls.__module__}.{cls.__name__}\n_partial_: true\n")
    return directory
