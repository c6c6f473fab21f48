"""The structure rules of docs/ARCHITECTURE.md that the import contract cannot see: a small package root, short
functions, mixers/ holding only token mixers, kernels named by import."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import seqmix.mixers as mixers_package
from seqmix.mixers.base import MixerState, TokenMixer

PACKAGE = Path(__file__).resolve().parents[1] / "seqmix"
MAX_FUNCTION_LINES = 50


def test_the_package_root_holds_at_most_three_modules():
    modules = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 3, modules


def test_no_function_is_longer_than_fifty_lines():
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({lines} lines)")
    assert not long, long


def test_mixers_holds_token_mixers_and_their_protocol_only():
    """Every class defined in seqmix/mixers is a TokenMixer, its state, or the per-head convolution core a
    conv mixer is made of (an nn.Module of layers.head_conv)."""
    from seqmix.layers.head_conv import HeadConvolution

    allowed = (TokenMixer, MixerState, HeadConvolution)
    stray = []
    for path in Path(mixers_package.__file__).parent.glob("*.py"):
        module = __import__(f"seqmix.mixers.{path.stem}", fromlist=["_"]) if path.stem != "__init__" else None
        for name, obj in inspect.getmembers(module, inspect.isclass) if module else []:
            if obj.__module__ == module.__name__ and not issubclass(obj, allowed):
                stray.append(f"{module.__name__}.{name}")
    assert not stray, stray


def test_no_module_is_imported_by_a_computed_name():
    """Dependencies are import statements a reader and lint-imports can see, never importlib on a built string,
    except where a checkpoint or config names a class (data/distilled.py, training/checkpoints.py)."""
    allowed = {"data/distilled.py", "training/checkpoints.py"}
    found = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
             if "import_module(" in p.read_text(encoding="utf-8") and str(p.relative_to(PACKAGE)) not in allowed]
    assert not found, found
