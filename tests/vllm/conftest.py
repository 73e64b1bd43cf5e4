"""vLLM end-to-end fixtures: a test-owned temp root for everything vLLM writes, and the tiny model.

The environment is set at import time, before any test imports vLLM, because vLLM reads these
variables when it is first imported (VLLM_ENABLE_V1_MULTIPROCESSING and the cache roots are read at import).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from vllm_harness import TINY_HYBRID_CONFIG, TINY_SLIDING_CONFIG, TRACE_LOG_ENV, write_tiny_model

_ROOT = Path(tempfile.mkdtemp(prefix="deferdump-vllm-"))
for _name in ("TMPDIR", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "HF_HOME"):
    (_ROOT / _name.lower()).mkdir()
    os.environ[_name] = str(_ROOT / _name.lower())
os.environ["VLLM_NO_USAGE_STATS"] = "1"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # in-process; the multiprocess test overrides it
tempfile.tempdir = None  # re-read TMPDIR: pytest's tmp_path and vLLM's sockets land under _ROOT


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_ROOT, ignore_errors=True)


@pytest.fixture(scope="session")
def vllm_root() -> Path:
    """The temp root that holds vLLM's caches, config, sockets and every store of these tests."""
    return _ROOT


@pytest.fixture(scope="session")
def tiny_model(vllm_root: Path) -> Path:
    """The tiny Llama's config only, for `load_format="dummy"` runs (the harness's default)."""
    return write_tiny_model(vllm_root / "tiny-llama", weights="none")


@pytest.fixture(scope="session")
def tiny_hybrid_model(vllm_root: Path) -> Path:
    """The tiny Llama with a sliding-window layer and a full-attention one (a hybrid model)."""
    return write_tiny_model(vllm_root / "tiny-hybrid-llama", TINY_HYBRID_CONFIG, weights="none")


@pytest.fixture(scope="session")
def tiny_sliding_model(vllm_root: Path) -> Path:
    """The tiny Llama with every layer sliding-window (one sliding-window KV-cache group)."""
    return write_tiny_model(vllm_root / "tiny-sliding-llama", TINY_SLIDING_CONFIG, weights="none")


@pytest.fixture(scope="session")
def tiny_model_weights(vllm_root: Path) -> Path:
    """The tiny Llama with seeded random weights (std 0.2): load it with `load_format="auto"` where a test
    compares outputs (dummy weights make them blind to the KV)."""
    return write_tiny_model(vllm_root / "tiny-llama-weights")


@pytest.fixture(scope="session")
def tiny_hybrid_model_weights(vllm_root: Path) -> Path:
    """The tiny hybrid Llama with seeded random weights (std 0.2), for output comparisons."""
    return write_tiny_model(vllm_root / "tiny-hybrid-llama-weights", TINY_HYBRID_CONFIG)


@pytest.fixture
def store_dir(vllm_root: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A fresh directory for one test's FileStores and metrics files."""
    path = Path(tempfile.mkdtemp(prefix=f"{request.node.name[:40]}-", dir=vllm_root))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "trace_rejected(event, reason): the scenario breaks the protocol; its log must fail validation at "
        "`event` for a reason containing `reason`",
    )
    config.addinivalue_line(
        "markers",
        "trace_beyond_model(reason): the run's logs hold events the trace model does not express yet; "
        "`deferdump validate` must refuse every run in one line containing `reason`",
    )


@pytest.fixture(autouse=True)
def trace_log(vllm_root: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every engine a test builds writes its connector event log here; after the test the logs must match
    the model (or, for a `trace_rejected` scenario, fail at the named event).

    Under `DEFERDUMP_TRACE_DIR/<test name>/` when that variable is set (kept), else a temp dir.
    """
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    base = os.environ.get("DEFERDUMP_TRACE_DIR")
    if base:
        path = Path(base) / safe
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    else:
        path = Path(tempfile.mkdtemp(prefix=f"trace-{safe[:40]}-", dir=vllm_root))
    monkeypatch.setenv(TRACE_LOG_ENV, str(path))
    yield path
    from trace_check import assert_beyond_model, assert_rejected_at, assert_runs_match, runs  # after vLLM's env

    if not runs(path):
        return  # the test built no engine
    rejected = request.node.get_closest_marker("trace_rejected")
    beyond = request.node.get_closest_marker("trace_beyond_model")
    if beyond is not None:
        assert_beyond_model(path, *beyond.args)
    elif rejected is not None:
        assert_rejected_at(path, *rejected.args)
    else:
        assert_runs_match(path)
    if not base:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def baselines(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """The watch's reference outputs (one run without a connector per scenario), shared by every watch test
    of this pytest run: under xdist a directory beside the workers' own (entries are keyed by a digest of
    everything they depend on and written atomically, tools/watch/runner.py `reference_outputs`)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if hasattr(request.config, "workerinput") else base
    path = shared / "watch-baselines"
    path.mkdir(exist_ok=True)
    return path
