# seqmix: `make install` then `make test`. Everything lives in .venv beside this file.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Pinned first so pip keeps the matching wheel: the CPU wheel on a machine that has it on disk,
# the CUDA build from PyPI on a GPU box. Override with `make install TORCH_VERSION=...`.
TORCH_VERSION ?= 2.13.0
PYTEST_ARGS ?=
# pytest-xdist workers: much of the suite is single-threaded (the Triton interpreter, subprocess start-up, C++
# compiles), so two workers pay off on 2 cores (benchmarks/README.md); each runs torch on one thread (tests/conftest.py).
PYTEST_WORKERS ?= 2
BENCH_ARGS ?=

export TRITON_DEFAULT_FP_FUSION ?= 1

.PHONY: install test test-fast lint fuzz bench gpu-check clean

install:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "torch==$(TORCH_VERSION)"
	$(PIP) install --quiet -e ".[dev]"
	$(PY) -c "import torch, lightning, hydra, seqmix; print('seqmix installed: torch', torch.__version__, '| cuda available:', torch.cuda.is_available())"

test: lint
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test-fast:
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m "not slow" $(PYTEST_ARGS)

# ruff, then the layer contract (import-linter, [tool.importlinter] in pyproject.toml; docs/ARCHITECTURE.md)
lint:
	$(PY) -m ruff check seqmix triton_kernels tests benchmarks train.py generate.py preprocess.py
	$(VENV)/bin/lint-imports

# the config fuzz test (tests/test_fuzz_configs.py) with more examples than make test's 30
FUZZ_EXAMPLES ?= 1000
fuzz:
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(PY) -m pytest -q --hypothesis-show-statistics tests/test_fuzz_configs.py

bench:
	$(PY) -m benchmarks.run $(BENCH_ARGS)

# one CUDA GPU, a few minutes: kernels, AMP, DDP, compile, decoding, WMT-size models (benchmarks/gpu_check.py); without
# CUDA it says so in one line and exits 0. Commit the report folder (benchmarks/results/gpu_check/).
GPU_CHECK_OUT ?= benchmarks/results/gpu_check/$(shell date +%Y-%m-%d_%H-%M)
GPU_CHECK_ARGS ?=
gpu-check:
	$(PY) -m benchmarks.gpu_check --out $(GPU_CHECK_OUT) $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
