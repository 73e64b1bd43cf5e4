"""Stand-in engine sessions for `EngineProcess` tests: the child protocol without vLLM.

Importable in the child (the tests put this directory on its PYTHONPATH); each setup is a context manager
whose exit leaves a file, so a test sees that the child ran its teardown."""
from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class Session:
    def __init__(self, name: str, marker: Path) -> None:
        self.name = name
        self.marker = marker
        self.calls = 0
        self.info = {"name": name, "pid": os.getpid(), "in_process": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")}


@contextmanager
def counting_session(name: str, marker: Path, start_delay: float = 0.0) -> Iterator[Session]:
    began = time.time()  # wall clock: comparable across processes
    time.sleep(start_delay)
    session = Session(name, marker)
    session.info.update(began=began, built=time.time())
    try:
        yield session
    finally:
        marker.write_text(f"closed after {session.calls} calls")


@contextmanager
def failing_setup(message: str) -> Iterator[Session]:
    raise RuntimeError(message)
    yield  # pragma: no cover


def count(session: Session, increment: int) -> dict[str, Any]:
    session.calls += increment
    return {"name": session.name, "calls": session.calls, "pid": os.getpid()}


def fail(session: Session, message: str) -> None:
    raise ValueError(message)


def die(session: Session, code: int) -> None:
    os._exit(code)


def sleep(session: Session, seconds: float) -> None:
    time.sleep(seconds)
