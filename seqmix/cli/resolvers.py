"""OmegaConf resolvers used by conf/: the project root, wandb's online/offline choice and the CPU recipes' precision."""

from __future__ import annotations

import netrc
import os
from pathlib import Path

from omegaconf import OmegaConf

from seqmix.preemption import slurm_job_folder

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def project_root() -> str:
    """The folder holding conf/ and train.py; an env var wins for installed (non-editable) use."""
    return os.environ.get("SEQMIX_ROOT", str(PROJECT_ROOT))


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


def cpu_training_precision() -> str:
    """Lightning's precision for the CPU recipes: ``bf16-mixed`` where the CPU multiplies bf16 natively (AVX512-BF16
    or AMX: 1.3-1.4x the fp32 tokens/s of every Multi30k recipe, the same loss per update), else ``32-true``:
    without those instructions oneDNN emulates bf16 and a bf16 matmul is several times slower than fp32 (7x on an
    AVX2-only EPYC)."""
    import torch

    caps = torch.cpu.get_capabilities() if hasattr(torch.cpu, "get_capabilities") else {}
    return "bf16-mixed" if caps.get("avx512_bf16") or caps.get("amx_bf16") else "32-true"


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("seqmix_root", project_root, replace=True)
    OmegaConf.register_new_resolver("seqmix_wandb_offline", wandb_offline, replace=True)
    OmegaConf.register_new_resolver("seqmix_cpu_training_precision", cpu_training_precision, replace=True)
    OmegaConf.register_new_resolver("seqmix_slurm_job_folder", slurm_job_folder, replace=True, use_cache=True)
