"""OmegaConf resolvers used by conf/: the project root and wandb's online/offline choice."""

from __future__ import annotations

import netrc
import os
from pathlib import Path

from omegaconf import OmegaConf

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


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("seqmix_root", project_root, replace=True)
    OmegaConf.register_new_resolver("seqmix_wandb_offline", wandb_offline, replace=True)
