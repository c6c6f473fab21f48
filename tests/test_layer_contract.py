"""The layer contract (pyproject.toml [tool.importlinter], docs/ARCHITECTURE.md) holds on this tree, and it is not
vacuous: each rule fails on a copy of the tree with one import that breaks it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=300)


def test_the_tree_keeps_every_contract():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module,line,contract", [
    ("seqmix/mixers/lightconv.py", "from seqmix.tasks import base", "Layers"),
    ("seqmix/generation/beam_search.py", "import seqmix.tasks.translation", "Layers"),
    ("seqmix/training/progress.py", "import seqmix.cli.common", "Layers"),
    ("seqmix/data/ragged.py", "import seqmix.models.stack", "Data knows no model"),
    ("triton_kernels/common.py", "import seqmix.errors", "Kernels import nothing of seqmix"),
    ("seqmix/mixers/base.py", "import omegaconf", "Only config and the commands read Hydra"),
    ("tests/helpers.py", "import seqmix.cli.train", "Tests and benchmarks never import seqmix.cli"),
])
def test_one_breaking_import_fails_its_contract(tmp_path, module, line, contract):
    tree = tmp_path / "tree"
    for part in ("seqmix", "triton_kernels", "tests", "benchmarks"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__", "fixtures"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    with open(tree / module, "a", encoding="utf-8") as f:
        f.write(f"\n{line}  # noqa\n")
    result = lint_imports(tree)
    assert result.returncode != 0
    broken = [row for row in result.stdout.splitlines() if row.endswith("BROKEN")]
    assert any(row.startswith(contract) for row in broken), result.stdout[-3000:]
