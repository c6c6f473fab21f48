"""The ``conf/mixer`` config group as the one list of mixers: tests, benchmarks and docs discover mixers here.

A mixer is registered by its config file alone (``conf/mixer/<name>.yaml`` with ``_target_`` and
``_partial_: true``); extra config folders (a plugin's, or the test tree's) holding a ``mixer/`` subfolder
join the group the same way ``hydra.searchpath`` adds them to ``train.py``.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf, open_dict

from seqmix.config.paths import conf_dir
from seqmix.config.runtime import job_overrides
from seqmix.errors import SeqmixError
from seqmix.mixers.base import TokenMixer


def _group_dirs(extra_conf_dirs: Iterable[str | Path] = ()) -> list[Path]:
    return [Path(d) / "mixer" for d in (conf_dir(), *extra_conf_dirs)]


def mixer_names(extra_conf_dirs: Iterable[str | Path] = ()) -> list[str]:
    """Every mixer of the group, sorted by name."""
    return sorted({p.stem for d in _group_dirs(extra_conf_dirs) for p in d.glob("*.yaml")})


def mixer_config(name: str, extra_conf_dirs: Iterable[str | Path] = ()) -> DictConfig:
    """A mixer's config file, as Hydra would put it under ``model.<side>.mixer``."""
    for d in _group_dirs(extra_conf_dirs):
        path = d / f"{name}.yaml"
        if path.is_file():
            return OmegaConf.load(path)
    raise KeyError(f"no mixer {name!r} in the mixer group; known: {mixer_names(extra_conf_dirs)}")


def mixer_class(name: str, extra_conf_dirs: Iterable[str | Path] = ()) -> type[TokenMixer]:
    return get_class(mixer_config(name, extra_conf_dirs)._target_)


def mixer_name_of(target: str, extra_conf_dirs: Iterable[str | Path] = ()) -> str:
    """The group name of the mixer class ``target`` (its ``_target_``); the class name, lowercased, if none."""
    for name in mixer_names(extra_conf_dirs):
        if mixer_config(name, extra_conf_dirs).get("_target_") == target:
            return name
    return target.rsplit(".", 1)[-1].lower()


def mixer_factory(name: str, extra_conf_dirs: Iterable[str | Path] = (), **options) -> partial:
    """The mixer's partial from its config, with ``options`` overriding the file's values."""
    cfg = OmegaConf.merge(mixer_config(name, extra_conf_dirs), options)
    return instantiate(cfg)


def _takes_group_mixers(model: DictConfig | None) -> bool:
    """Whether either side of the model config holds a group mixer (``mixer``) or a hybrid legend: ConvS2S holds
    neither, its presets switch both sides' ``mixer@`` entries off."""
    sides = [(model or {}).get(side) for side in ("encoder", "decoder")]
    return any(isinstance(s, DictConfig) and ("mixer" in s or "legend" in s) for s in sides)


def _mixer_given(overrides: list[str]) -> str | None:
    """The command line's ``mixer=<name>`` (also ``+mixer=``/``++mixer=``), or None."""
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+") == "mixer" and value:
            return value
    return None


def settle_mixer_choice(cfg: DictConfig) -> None:
    """Drop the composed top-level ``mixer`` node: it only names the choice both sides start from, so an option
    set there (``mixer.kernel_size=...``) would change nothing, and neither would ``mixer=<name>`` with a model
    whose layers are no group mixers (ConvS2S). Say so instead of ignoring it."""
    if "mixer" not in cfg:
        return
    given = _mixer_given(job_overrides())
    if given is not None and "model" in cfg and not _takes_group_mixers(cfg.model):
        name = cfg.model.get("name", "this model")
        raise SeqmixError(f"mixer={given} does nothing with model={name}: ConvS2S has its own gated convolution "
                          "(GLU) blocks, no mixer-group layers; drop mixer= or pick a model with mixers, e.g. "
                          f"model=transformer_small mixer={given}")
    choice = HydraConfig.get().runtime.choices.get("mixer") if HydraConfig.initialized() else None
    if choice is not None and (conf_dir() / "mixer" / f"{choice}.yaml").is_file():
        changed = sorted(k for k, v in cfg.mixer.items() if mixer_config(choice).get(k) != v)
        if changed:
            raise SeqmixError(f"mixer options go to a side: model.encoder.mixer.{changed[0]}=... and/or "
                              f"model.decoder.mixer.{changed[0]}=... (the top-level mixer.{changed[0]} changes nothing)")
    with open_dict(cfg):
        del cfg["mixer"]
