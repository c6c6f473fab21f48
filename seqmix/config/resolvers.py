"""OmegaConf resolvers used by conf/: the project root, the data folder, wandb's online/offline choice, tags and
group, and the CPU recipes' precision."""

from __future__ import annotations

import netrc
import os
from pathlib import Path

from omegaconf import OmegaConf

from seqmix.config import paths
from seqmix.config.runtime import hydra_choices
from seqmix.training.preemption import slurm_job_folder


def project_root() -> str:
    return str(paths.project_root())


def data_dir() -> str:
    """``paths.data_dir``: $SEQMIX_DATA_DIR when set; else ``../shared/data`` beside the project when it exists (this
    project's CI data); else a per-user folder, ``$XDG_CACHE_HOME/seqmix/data`` (``~/.cache/seqmix/data``), where
    ``python preprocess.py task=<task> download=true`` puts the corpora."""
    if os.environ.get("SEQMIX_DATA_DIR"):
        return os.environ["SEQMIX_DATA_DIR"]
    shared = f"{paths.project_root()}/../shared/data"
    if Path(shared).is_dir():
        return shared
    cache = os.environ.get("XDG_CACHE_HOME", "")
    cache = Path(cache) if Path(cache).is_absolute() else Path.home() / ".cache"  # a relative one is invalid (XDG)
    return str(cache / "seqmix" / "data")


def wandb_offline() -> bool:
    """Offline unless credentials exist: WANDB_API_KEY or an api.wandb.ai entry in ~/.netrc."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode in ("offline", "dryrun", "disabled"):
        return True
    if mode == "online" or os.environ.get("WANDB_API_KEY"):
        return False
    try:
        auth = netrc.netrc(os.environ.get("NETRC", str(Path.home() / ".netrc")))
        return auth.authenticators("api.wandb.ai") is None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return True


def _mixer_names(model) -> list[str]:
    """The mixer group names (conf/mixer) of a model's stacks, hybrid legends included."""
    from seqmix.config.mixer_group import mixer_name_of

    targets = []
    for side in ("encoder", "decoder"):
        node = model.get(side) if hasattr(model, "get") else None
        if node is None or not hasattr(node, "get"):
            continue
        targets += [m.get("_target_") for m in [node.get("mixer"), *(node.get("legend") or {}).values()]
                    if m is not None and hasattr(m, "get")]
    return sorted({mixer_name_of(t) for t in targets if t})


def run_tags(user_tags, *, _root_) -> list[str]:
    """wandb tags: task=, model=, mixer= (each mixer of the stacks), experiment= and sweep= (a multirun's folder),
    then the user's ``tags``, so that runs can be filtered by what they ran."""
    choices, sweep = hydra_choices()
    tags = [f"task={_root_.task.name}", f"model={_root_.model.name}"]
    tags += [f"mixer={name}" for name in _mixer_names(_root_.model)]
    if choices.get("experiment"):
        tags.append(f"experiment={choices['experiment']}")
    if sweep:
        tags.append(f"sweep={Path(sweep).name}")
    return tags + [str(t) for t in (user_tags or []) if str(t) not in tags]


def run_group(default: str, *, _root_) -> str:
    """wandb group: a multirun's jobs share one (experiment or task, and the sweep folder's name); else ``default``."""
    choices, sweep = hydra_choices()
    if not sweep:
        return default
    return f"{choices.get('experiment') or _root_.task.name}-{Path(sweep).name}"


def cpu_training_precision() -> str:
    """Lightning's precision for the CPU recipes: ``bf16-mixed`` where the CPU multiplies bf16 natively (AVX512-BF16
    or AMX), else ``32-true``: without those instructions oneDNN emulates bf16, which is slower than fp32
    (benchmarks/README.md, "Measurements behind the defaults")."""
    import torch

    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    return "bf16-mixed" if caps.get("avx512_bf16") or caps.get("amx_bf16") else "32-true"


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("seqmix_root", project_root, replace=True)
    OmegaConf.register_new_resolver("seqmix_data_dir", data_dir, replace=True)
    OmegaConf.register_new_resolver("seqmix_wandb_offline", wandb_offline, replace=True)
    OmegaConf.register_new_resolver("seqmix_run_tags", run_tags, replace=True)
    OmegaConf.register_new_resolver("seqmix_run_group", run_group, replace=True)
    OmegaConf.register_new_resolver("seqmix_cpu_training_precision", cpu_training_precision, replace=True)
    OmegaConf.register_new_resolver("seqmix_slurm_job_folder", slurm_job_folder, replace=True, use_cache=True)
