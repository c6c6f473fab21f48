"""Where the project's ``conf/`` folder is, decided once: beside ``train.py`` in the checkout, or under
``SEQMIX_ROOT`` when that is set (an installed, non-editable seqmix has no checkout around it)."""

from __future__ import annotations

import os
from pathlib import Path

CHECKOUT_ROOT = Path(__file__).resolve().parents[2]


def project_root() -> Path:
    """The folder holding ``conf/`` and ``train.py``."""
    return Path(os.environ.get("SEQMIX_ROOT") or CHECKOUT_ROOT)


def conf_dir() -> Path:
    return project_root() / "conf"
