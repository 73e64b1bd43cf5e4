"""One vLLM engine in a child process of its own, driven by calls over a pipe: several engines alive at once.

Why: vLLM keeps one engine per process (its connector and parallel state are process globals), so a driver
that builds engines one after another in its own process compares connectors measured minutes apart. On a
shared machine whose speed drifts by 2x within seconds (docs/benchmarks.md, "Inside vLLM"), comparisons need
the engines side by side, each run next to the others'. Each child runs `python -m
deferdump.tools.vllmrun.engine_process`, sets vLLM's in-process environment (`engine.prepare_environment`)
before anything imports vLLM, enters a setup context (a module-level function, pickled by reference, that
builds the engine) and then serves calls `fn(session, *args)` one at a time until told to stop or until the
parent's end of the pipe closes. Its stdout and stderr go to a log file, whose tail any error quotes.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from deferdump.reference.errors import UserError

logger = logging.getLogger(__name__)

#: Seconds an engine may take to build (model load, KV cache, connector) before the child is given up.
START_TIMEOUT_S = 900.0
#: Seconds one call may take (a bench measurement is seconds; a hung engine must not hang the driver).
CALL_TIMEOUT_S = 900.0
_STOP_GRACE_S = 60.0


class EngineProcessError(UserError):
    """A child engine failed to start, failed a call, died, or did not answer in time (one line)."""


class EngineProcess:
    """A child process holding one engine. `start()` spawns it; `wait_ready()` waits for the engine;
    `call(fn, *args)` runs `fn(session, *args)` there and returns its (picklable) result; `close()` stops it.

    `setup(*setup_args)` (module-level, importable in the child) must return a context manager whose value is
    the session each call receives. Starting several children before waiting for any builds them in parallel.
    """

    def __init__(self, label: str, root: Path, setup: Callable[..., Any], *setup_args: Any) -> None:
        self.label = label
        self.root = Path(root)
        self.log_path = self.root / f"engine-{_safe(label)}.log"
        self._setup = (setup, setup_args)
        self._process: subprocess.Popen[bytes] | None = None
        self._to_child: Connection | None = None
        self._from_child: Connection | None = None
        self.info: Any = None  # what the setup context reported once ready (e.g. vLLM's version)

    def start(self) -> "EngineProcess":
        self.root.mkdir(parents=True, exist_ok=True)
        child_read, parent_write = os.pipe()
        parent_read, child_write = os.pipe()
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(child_read), str(child_write), str(self.root)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=(child_read, child_write),
            )
        os.close(child_read)
        os.close(child_write)
        self._to_child = Connection(parent_write, readable=False)
        self._from_child = Connection(parent_read, writable=False)
        self._to_child.send(self._setup)
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> Any:
        self.info = self._receive(timeout, "start")
        return self.info

    def call(self, fn: Callable[..., Any], *args: Any, timeout: float = CALL_TIMEOUT_S) -> Any:
        if self._to_child is None:
            raise EngineProcessError(f"engine {self.label}: not started")
        try:
            self._to_child.send((fn, args))
        except (BrokenPipeError, OSError):
            raise EngineProcessError(f"engine {self.label}: the process is gone ({self._exit_text()}); "
                                     f"log {self.log_path}: {self._log_tail()}") from None
        return self._receive(timeout, getattr(fn, "__name__", "call"))

    def _receive(self, timeout: float, what: str) -> Any:
        assert self._from_child is not None
        deadline = time.monotonic() + timeout
        while not self._from_child.poll(0.5):
            if self._process is not None and self._process.poll() is not None and not self._from_child.poll(0):
                raise EngineProcessError(f"engine {self.label}: the process exited during {what} "
                                         f"({self._exit_text()}); log {self.log_path}: {self._log_tail()}")
            if time.monotonic() > deadline:
                self.close(kill=True)
                raise EngineProcessError(f"engine {self.label}: no answer to {what} within {timeout:.0f} s; "
                                         f"log {self.log_path}")
        try:
            status, value = self._from_child.recv()
        except (EOFError, OSError):
            raise EngineProcessError(f"engine {self.label}: the process exited during {what} "
                                     f"({self._exit_text()}); log {self.log_path}: {self._log_tail()}") from None
        if status == "error":
            raise EngineProcessError(f"engine {self.label}: {what} failed: {value}")
        return value

    def close(self, kill: bool = False) -> None:
        """Stop the child (its setup context exits: the engine shuts down); kill it if it does not stop, or at
        once with `kill` (a child that stopped answering)."""
        process, self._process = self._process, None
        if kill and process is not None:
            process.kill()
        if self._to_child is not None:
            try:
                self._to_child.send(None)
            except (BrokenPipeError, OSError):
                pass
        if process is not None:
            try:
                process.wait(_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                logger.warning("engine %s did not stop within %.0f s: killed", self.label, _STOP_GRACE_S)
                process.kill()
                process.wait()
        for connection in (self._to_child, self._from_child):
            if connection is not None:
                connection.close()
        self._to_child = self._from_child = None

    def _exit_text(self) -> str:
        """The child's exit code. Its end of the pipe closes while it exits, a moment before the kernel
        reports the exit: wait that moment rather than call a dying child "still running"."""
        if self._process is None:
            return "stopped"
        try:
            return f"exit code {self._process.wait(5.0)}"
        except subprocess.TimeoutExpired:
            return "still running"

    def _log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(line.strip() for line in text[-lines:]) or "(empty log)"

    def __enter__(self) -> "EngineProcess":
        return self if self._process is not None else self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _safe(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in label)


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000]


def serve(requests: Connection, replies: Connection, root: Path) -> int:
    """The child's loop (see the module docstring); returns its exit code."""
    from deferdump.tools.vllmrun import engine

    engine.prepare_environment(root)  # before the setup's unpickling can import vLLM
    try:
        setup, setup_args = requests.recv()
        context = setup(*setup_args)
        session = context.__enter__()
    except EOFError:
        return 0
    except BaseException as exc:  # the parent gets one line; the log keeps the traceback
        traceback.print_exc()
        replies.send(("error", _one_line(exc)))
        return 1
    try:
        replies.send(("ok", getattr(session, "info", None)))
        while True:
            try:
                request = requests.recv()
            except EOFError:  # the parent is gone
                return 0
            if request is None:
                return 0
            fn, args = request
            try:
                result = fn(session, *args)
            except Exception as exc:
                traceback.print_exc()
                replies.send(("error", _one_line(exc)))
                return 1
            replies.send(("ok", result))
    finally:
        context.__exit__(None, None, None)  # the engine shuts down whatever ended the loop
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    read_fd, write_fd, root = int(argv[0]), int(argv[1]), Path(argv[2])
    return serve(Connection(read_fd, writable=False), Connection(write_fd, readable=False), root)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
