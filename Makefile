# seqmix: `make install` then `make test`. Everything lives in .venv beside this file.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch is pinned and installed first, so that pip keeps that build: the CUDA build where `nvidia-smi -L` lists a GPU,
# the CPU build (torch==X+cpu) elsewhere, from pip's own sources when they hold it (a local wheel folder), else from
# PyTorch's CPU index rather than PyPI's multi-GB CUDA build. Force one with `make install TORCH_BUILD=cuda` or
# `TORCH_BUILD=cpu`; another version with TORCH_VERSION=..., another CUDA build with TORCH_INDEX_cuda=<index URL>.
TORCH_VERSION ?= 2.13.0
TORCH_BUILD ?= $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]' && echo cuda || echo cpu)
TORCH_INDEX_cuda ?= https://download.pytorch.org/whl/cu130
TORCH_INDEX_cpu ?= https://download.pytorch.org/whl/cpu
TORCH_REQUIREMENT_cuda = torch==$(TORCH_VERSION)
TORCH_REQUIREMENT_cpu = torch==$(TORCH_VERSION)+cpu
TORCH_FROM_INDEX = $(PIP) install --quiet "$(TORCH_REQUIREMENT_$(TORCH_BUILD))" \
	--index-url $(TORCH_INDEX_$(TORCH_BUILD)) --extra-index-url https://pypi.org/simple
PYTEST_ARGS ?=
# pytest-xdist workers: much of the suite is single-threaded (the Triton interpreter, subprocess start-up, C++
# compiles), so two workers pay off on 2 cores (benchmarks/README.md); each runs torch on one thread (tests/conftest.py).
PYTEST_WORKERS ?= 2
BENCH_ARGS ?=

export TRITON_DEFAULT_FP_FUSION ?= 1

.PHONY: install test test-fast lint fuzz bench results gpu-check clean

install:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	@echo "torch $(TORCH_VERSION), $(TORCH_BUILD) build (TORCH_BUILD=cpu|cuda to choose)"
ifeq ($(TORCH_BUILD),cuda)
	$(TORCH_FROM_INDEX)
else ifeq ($(TORCH_BUILD),cpu)
	$(PIP) install --quiet "$(TORCH_REQUIREMENT_cpu)" 2>/dev/null || $(TORCH_FROM_INDEX)
else
	$(error TORCH_BUILD must be cpu or cuda, got '$(TORCH_BUILD)')
endif
	$(PIP) install --quiet -e ".[dev,serve]"
	$(PY) -c "import torch, lightning, hydra, seqmix; print('seqmix installed: torch', torch.__version__, '| cuda available:', torch.cuda.is_available())"

# --durations: the CI log names the slowest tests, to keep make test under 15 minutes
test: lint
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=15 $(PYTEST_ARGS)

test-fast:
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m "not slow" $(PYTEST_ARGS)

# ruff, then the layer contract (import-linter, [tool.importlinter] in pyproject.toml; docs/ARCHITECTURE.md)
lint:
	$(PY) -m ruff check seqmix triton_kernels tests benchmarks train.py generate.py preprocess.py
	$(VENV)/bin/lint-imports

# the fuzz tests (configs: tests/test_fuzz_configs.py; commands and files: tests/test_fuzz_commands.py) with more
# examples than make test's 30 and 12
FUZZ_EXAMPLES ?= 1000
COMMAND_FUZZ_EXAMPLES ?= 500
fuzz:
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) COMMAND_FUZZ_EXAMPLES=$(COMMAND_FUZZ_EXAMPLES) $(PY) -m pytest -q \
		--hypothesis-show-statistics tests/test_fuzz_configs.py tests/test_fuzz_commands.py

# the README's results tables, one set per machine kind, from the recipe runs' records in benchmarks/results/recipes (seqmix/report/results.py)
results:
	$(PY) -m seqmix.report results --readme README.md

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
