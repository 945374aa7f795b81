# Two commands do everything on a fresh machine: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
UV_VERSION := 0.13.9
# uv is installed with the machine's own pip when it is missing, and always called through it.
UV := $(PYTHON) -m uv
VENV := .venv
RUN := $(UV) run --frozen --all-packages
# One worker more than the 2 cores CI has: many tests mostly wait (daemons, Slurm, tmux, timeouts), and a third
# worker runs while they do; each worker's torch uses one thread (OMP_NUM_THREADS=1 below), so three workers
# do not fight over two cores with six; the slowest tests are listed at the end.
PYTEST_WORKERS ?= 3

.PHONY: help setup setup-cuda lint format typecheck pytest test demo bench clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# Bytecode is compiled once at set-up, the dependencies' (--compile-bytecode) and the workspace's own: where
# PYTHONDONTWRITEBYTECODE is set (as on the development and CI machines) Python never caches it, and every process
# compiled what it imports from source (textual, transformers and the workspace: 0.2-0.4 s each per process).
$(VENV)/.installed: uv.lock pyproject.toml packages/engine/pyproject.toml packages/deeptrace/pyproject.toml packages/clusterx/pyproject.toml apps/tui/pyproject.toml packages/deeptrace/hatch_build.py packages/deeptrace/src/deeptrace/collect/_hotpath.c
	@$(UV) --version >/dev/null 2>&1 || $(PYTHON) -m pip install --quiet "uv==$(UV_VERSION)"
	$(UV) sync --locked --all-packages --compile-bytecode
	@$(VENV)/bin/python -m compileall -q -j 0 packages/engine/src packages/deeptrace/src packages/clusterx/src apps/tui/src >/dev/null
	@touch $@

setup: $(VENV)/.installed  ## create .venv with the four packages and the development tools

lint: setup  ## ruff lint and format check
	$(RUN) ruff check .
	$(RUN) ruff format --check .

format: setup  ## apply ruff's formatting and fixes
	$(RUN) ruff format .
	$(RUN) ruff check --fix .

typecheck: setup  ## mypy --strict over the four packages
	$(RUN) mypy packages/engine/src packages/deeptrace/src packages/clusterx/src apps/tui/src

pytest: setup  ## the whole test suite (slow tests included)
	OMP_NUM_THREADS=1 $(RUN) pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=25 $(PYTEST_ARGS)

test: lint typecheck pytest  ## install, then lint, type check and the whole test suite

demo: setup  ## install, then run the main job and analyse its run directory
	$(RUN) python tools/demo.py

bench: setup  ## run every benchmark in tools/bench, then list their wall times (figures go to docs/benchmarks.md by hand)
	$(RUN) python tools/run_benchmarks.py $(BENCH)

clean:  ## remove the environment and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache runs

setup-cuda:  ## on a machine with NVIDIA GPUs: .venv from PyPI's default (CUDA) torch; see docs/install.md
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet "torch>=2.11,<2.15"
	$(VENV)/bin/pip install --quiet -e packages/deeptrace -e packages/clusterx -e "packages/engine[cuda]" -e apps/tui
	$(VENV)/bin/pip install --quiet "pytest>=8.3,<9" pytest-xdist pytest-timeout hypothesis "transformers>=5.0"
