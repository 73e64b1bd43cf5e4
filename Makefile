# deferdump: two commands matter — `make verify` (the main job) and `make test` (the test suite).
# Each sets up what it needs on a fresh machine through `make setup`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deferdump-installed

.PHONY: setup verify test test-vllm bench clean java-check

setup: java-check $(STAMP)

java-check:
	@command -v java >/dev/null 2>&1 || { echo "make setup: java not found: install a JRE >= 11 (Debian: apt-get install -y openjdk-17-jre-headless)" >&2; exit 1; }

# torch first, pinned to the CPU build on this machine's disk: a bare `torch` would pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,bench]'
	@touch $(STAMP)

verify: setup
	$(VENV)/bin/deferdump verify

test: setup
	$(VENV)/bin/pytest -q tests --ignore=tests/vllm -p no:cacheprovider

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
