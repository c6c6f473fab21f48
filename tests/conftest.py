"""Shared test setup. TRITON_INTERPRET must be set before any @triton.jit function is defined."""

import os
import sys
from pathlib import Path

import pytest

try:
    import torch

    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _HAS_CUDA = False
if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("PYTEST_XDIST_WORKER") and "torch" in sys.modules:
    # `make test` runs two pytest workers (pytest-xdist): one torch thread each keeps them from fighting over the
    # cores; the subprocesses a test starts (train.py, benchmarks) keep torch's default.
    torch.set_num_threads(1)
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# decoding keeps freed memory in the heap for good (seqmix/generation/memory.py): not in the long-lived test processes
# (tests/generation/test_memory.py runs it in a subprocess)
os.environ.setdefault("SEQMIX_KEEP_FREED_MEMORY", "0")

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SEQMIX_DATA_DIR", ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data; CI always has it (a missing folder there is a failure, not a skip)."""
    if not (SHARED_DATA / "multi30k").is_dir():
        message = f"real data not found at {SHARED_DATA} (place ../shared beside the clone or set SEQMIX_DATA_DIR)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return SHARED_DATA


@pytest.fixture(scope="session")
def multi30k_dir(shared_data) -> Path:
    return shared_data / "multi30k"


def pytest_collection_modifyitems(config, items):
    if _HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


PYTHON = sys.executable
