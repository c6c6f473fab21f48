"""What Hydra's runtime says about the running job: its overrides, whether it is a multirun job, its group choices.
Outside a Hydra app (tests, the Python API) there is no runtime, and each answer says so."""

from __future__ import annotations

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode


def job_overrides() -> list[str]:
    """The command-line overrides of this Hydra job (one sweep point's, in a multirun)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def hydra_choices() -> tuple[dict, str | None]:
    """(the run's config-group choices, its sweep folder when it is a multirun job)."""
    if not HydraConfig.initialized():
        return {}, None
    hydra = HydraConfig.get()
    return dict(hydra.runtime.choices), hydra.sweep.dir if in_multirun() else None
