"""Running the TLC model checker as a subprocess and turning its output into a :class:`TlcResult`.

Each run gets a private directory holding copies of the spec directory's ``.tla``/``.cfg`` files (plus
generated modules and configs), its own ``java.io.tmpdir`` (TLC unpacks the standard modules there and
concurrent runs would collide) and its own ``-metadir``; TLC never writes beside the user's files. The JVM
maps (or, first, writes) the class-data-sharing archive of :mod:`deferdump.tools.tlc.cds`.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from deferdump.reference.errors import UserError
from deferdump.tools.tlc.cds import Mode as CdsMode
from deferdump.tools.tlc.cds import plan as cds_plan
from deferdump.tools.tlc.java import jit_args, locate_tlc
from deferdump.tools.tlc.output import (
    Code,
    Kind,
    MessageStream,
    Progress,
    Status,
    TlcMessage,
    TlcOutputError,
    TlcResult,
    TraceState,
    interpret,
    parse_progress,
    reported_exit_status,
)

__all__ = [
    "Kind",
    "Progress",
    "RunDirNotEmpty",
    "SpecNotFound",
    "Status",
    "TlcMessage",
    "TlcOutputError",
    "TlcResult",
    "TlcUsageError",
    "TraceState",
    "run_tlc",
]

log = logging.getLogger(__name__)

_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_HEAP = re.compile(r"\d+[kKmMgG]?\Z")


class TlcUsageError(UserError):
    """``run_tlc`` was called with arguments that cannot work (bad workers, heap, module names…)."""


class SpecNotFound(TlcUsageError):
    """The spec or config file does not exist."""


class RunDirNotEmpty(TlcUsageError):
    """``keep_dir`` already holds files; deferdump never writes over them."""


def _check_arguments(spec: Path, workers: int, heap: str, timeout: float | None,
                     extra_modules: Mapping[str, str]) -> None:
    generated_spec = spec.stem in extra_modules or spec.name in extra_modules
    if not spec.is_file() and not (generated_spec and spec.parent.is_dir()):
        raise SpecNotFound(f"spec not found: {spec}")
    if spec.suffix != ".tla":
        raise TlcUsageError(f"not a TLA+ module (expected a .tla file): {spec}")
    if not _MODULE_NAME.match(spec.stem):
        raise TlcUsageError(f"module file name is not a TLA+ identifier: {spec.name}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise TlcUsageError(f"workers must be a positive integer, not {workers!r}")
    if not _HEAP.match(heap):
        raise TlcUsageError(f"heap must look like 512m or 2g, not {heap!r}")
    if timeout is not None and timeout <= 0:
        raise TlcUsageError(f"timeout must be positive, not {timeout!r}")
    for name in extra_modules:
        stem = name[:-4] if name.endswith((".tla", ".cfg")) else name
        if not _MODULE_NAME.match(stem):
            raise TlcUsageError(f"extra module name is not a TLA+ identifier: {name!r}")


def _generated_files(extra_modules: Mapping[str, str]) -> dict[str, str]:
    """File name -> text: a bare module name becomes ``Name.tla``; ``.tla``/``.cfg`` names are kept."""
    return {(name if name.endswith((".tla", ".cfg")) else f"{name}.tla"): text
            for name, text in extra_modules.items()}


def _prepare_run_dir(run_dir: Path, spec: Path, config: Path | str | None,
                     generated: Mapping[str, str]) -> tuple[str, Path | None]:
    """Copy the spec directory's modules and configs into ``run_dir``; return (cfg name there, cfg source)."""
    for source in sorted(spec.parent.iterdir()):
        if source.suffix in (".tla", ".cfg") and source.is_file():
            shutil.copyfile(source, run_dir / source.name)
    for name, text in generated.items():
        (run_dir / name).write_text(text, encoding="utf-8")

    if config is None:
        default = spec.with_suffix(".cfg").name
        if not (run_dir / default).is_file():
            raise SpecNotFound(f"config not found: {spec.with_suffix('.cfg')} (pass a config explicitly)")
        return default, (spec.with_suffix(".cfg") if default not in generated else None)
    config_path = Path(config)
    if config_path.is_file():
        if config_path.suffix != ".cfg":
            raise TlcUsageError(f"not a TLC config (expected a .cfg file): {config_path}")
        name = config_path.name
        target = run_dir / name
        if target.exists() and target.read_bytes() != config_path.read_bytes():
            name = f"deferdump_{name}"
            target = run_dir / name
        shutil.copyfile(config_path, target)
        return name, config_path
    if config_path.name in generated and str(config) == config_path.name:
        return config_path.name, None
    raise SpecNotFound(f"config not found: {config}")


class _Watchdog(threading.Thread):
    """Kills the JVM's process group when the deadline passes or ``cancel`` is set."""

    def __init__(self, process: subprocess.Popen[str], deadline: float | None,
                 cancel: threading.Event | None) -> None:
        super().__init__(name="tlc-watchdog", daemon=True)
        self.process = process
        self.deadline = deadline
        self.cancel = cancel
        self.done = threading.Event()
        self.reason: Kind | None = None

    def run(self) -> None:
        while not self.done.wait(0.05):
            if self.cancel is not None and self.cancel.is_set():
                self.reason = Kind.CANCELLED
            elif self.deadline is not None and time.monotonic() >= self.deadline:
                self.reason = Kind.TIMEOUT
            else:
                continue
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            return


def run_tlc(
    spec: Path,
    config: Path | None = None,
    *,
    workers: int = 1,
    timeout: float | None = None,
    extra_args: Sequence[str] = (),
    extra_modules: Mapping[str, str] = {},  # noqa: B006 - read only
    progress: Callable[[Progress], None] | None = None,
    cancel: threading.Event | None = None,
    heap: str = "1g",
    keep_dir: Path | None = None,
    jvm_args: Sequence[str] = (),
    expected_states: int | None = None,
    end_after_report: bool = True,
) -> TlcResult:
    """Model-check ``spec`` with ``config`` (default: the ``.cfg`` beside it) and return the typed result.

    ``extra_modules`` maps a module name to TLA+ text (written as ``Name.tla``); names ending in ``.cfg``
    or ``.tla`` are written verbatim. ``config`` may then be such a bare generated name, and ``spec``
    may be ``<dir>/<Name>.tla`` for a generated module ``Name`` (e.g. an MC wrapper of the modules in dir).
    ``extra_args`` go to TLC after the standard ones (e.g. ``-dump dot,actionlabels graph`` or
    ``-simulate file=trace,num=10 -depth 20 -seed 1``); relative paths land in the run directory, which
    is ``keep_dir`` when given (created, must be empty, and kept) and a removed temp dir otherwise.
    A timeout or cancellation kills the JVM and returns status ``error`` with kind ``timeout`` /
    ``cancelled`` and the counts reported so far. Raises :class:`TlcUsageError` for bad arguments and
    :class:`~deferdump.tools.tlc.java.JavaError` when Java or the jar is unusable.
    ``expected_states`` (the model's known distinct-state count, if any) picks the JIT flags
    (:func:`~deferdump.tools.tlc.java.jit_args`): a small model starts faster on the C1 compiler alone.
    ``end_after_report``: once a run has printed its whole report (a clean finish, or one invariant, deadlock
    or temporal-property violation with its trace, then "Finished in": :func:`reported_exit_status`), the
    bridge ends the JVM instead of waiting out its shutdown (about 0.3 s: TLC's fingerprint set is an RMI
    object whose accept thread HotSpot waits for at exit) and records the exit status TLC gives such a run.
    It applies only where nothing is written at exit: no ``extra_args`` (which may ask for dumps or
    simulation files), no ``keep_dir``, ``jvm_args`` limited to JIT, GC and heap flags
    (:func:`ends_after_report`), and not while the run writes the class-data-sharing archive.
    """
    spec = Path(spec)
    _check_arguments(spec, workers, heap, timeout, extra_modules)
    install = locate_tlc()
    generated = _generated_files(extra_modules)

    if keep_dir is not None:
        run_dir = Path(keep_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        if any(run_dir.iterdir()):
            raise RunDirNotEmpty(f"keep_dir {run_dir} is not empty")
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="deferdump-tlc-"))
    try:
        cfg_name, cfg_source = _prepare_run_dir(run_dir, spec, config, generated)
        (run_dir / "tmp").mkdir(exist_ok=True)  # java.io.tmpdir must exist, or SANY finds no standard modules

        # TLC checks temporal properties at timed intervals during the search by default, so which lasso a
        # liveness counterexample shows, and how many states it counted first, depend on the machine's load;
        # `-lncheck final` checks them once, on the whole graph; with a fixed fingerprint polynomial
        # (FINGERPRINT_INDEX) every run then shows the same counterexample and counts.
        liveness_args = () if "-simulate" in extra_args else ("-lncheck", "final")
        fingerprint_args = () if "-fp" in extra_args else ("-fp", str(FINGERPRINT_INDEX))

        def command(sharing: tuple[str, ...]) -> list[str]:
            return [
                str(install.java), "-XX:+UseParallelGC", f"-Xmx{heap}", f"-Djava.io.tmpdir={run_dir / 'tmp'}",
                *sharing, *jit_args(expected_states), *jvm_args, "-cp", str(install.jar), "tlc2.TLC",
                "-tool", "-nowarning", "-metadir", str(run_dir / "states"), "-workers", str(workers),
                "-config", cfg_name, *liveness_args, *fingerprint_args, *extra_args, spec.stem,
            ]

        cfg_text = (run_dir / cfg_name).read_text(encoding="utf-8", errors="replace")
        sharing = cds_plan(install, jvm_args)
        completed = False
        try:
            early = (end_after_report and ends_after_report(extra_args, jvm_args, keep_dir)
                     and sharing.mode is not CdsMode.CREATE)
            result = _execute(command(sharing.args), run_dir, timeout, cancel, progress, install.jar_overridden,
                              spec=spec, cfg_text=cfg_text, end_after_report=early)
            if sharing.mode is not CdsMode.OFF and _jvm_never_started_tlc(result):
                # A JVM that refuses an option, or maps a damaged archive (SIGBUS), dies before TLC prints
                # its version line; the same run without CDS gives the real verdict.
                log.debug("TLC's JVM failed with CDS flags (exit %s): running again without them\n%s",
                          result.exit_code, result.output[-2000:])
                for crash_report in run_dir.glob("hs_err_pid*.log"):
                    crash_report.unlink(missing_ok=True)
                result = _execute(command(()), run_dir, timeout, cancel, progress, install.jar_overridden,
                                  spec=spec, cfg_text=cfg_text)
                if not _jvm_never_started_tlc(result):  # CDS was the culprit, not e.g. the heap or jvm_args
                    sharing.abandon()
            else:
                completed = result.distinct_states is not None and result.kind not in (Kind.TIMEOUT, Kind.CANCELLED)
        finally:
            sharing.finish(completed)
        result.config = cfg_source
        result.run_dir = run_dir if keep_dir is not None else None
        return result
    finally:
        if keep_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)


_QUIET_AT_EXIT = re.compile(
    r"-Xm[xsn]\S+|-Xss\S+|-XX:[+-]Use\w*GC|-XX:ParallelGCThreads=\d+|-XX:TieredStopAtLevel=\d|"
    r"-XX:[+-]TieredCompilation|-XX:CICompilerCount=\d+")
"""JVM flags that make a JVM write nothing at exit (JIT, GC and heap settings)."""

FINGERPRINT_INDEX = 1
"""TLC's fingerprint polynomial (``-fp``) unless the caller gives one. TLC 2.15 picks one at random per run (its
banner's "fp N"), and which lasso a liveness counterexample shows depends on it, even with ``-lncheck final``
(``ContractNeverReports``: loop index 2, 4 or 10 over four runs); a fixed one gives every run the same report."""

EXIT_GRACE_S = 0.05
"""How long a JVM whose report is complete may take to exit by itself before the bridge ends it."""


def ends_after_report(extra_args: Sequence[str], jvm_args: Sequence[str], keep_dir: Path | None) -> bool:
    """May a run with these arguments be ended once its report is complete? Only if nothing the caller
    may read is still written at exit: TLC's own outputs (``extra_args``: ``-dump``, ``-simulate`` files),
    a kept run directory, or JVM outputs (a flight recording, logs, a CDS archive from ``jvm_args``)."""
    return not extra_args and keep_dir is None and all(_QUIET_AT_EXIT.fullmatch(arg) for arg in jvm_args)


def _end_after_report(process: subprocess.Popen[str]) -> bool:
    """Give the JVM a moment to exit by itself, else end it; True if the bridge ended it."""
    try:
        process.wait(timeout=EXIT_GRACE_S)
        return False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        return True


def _jvm_never_started_tlc(result: TlcResult) -> bool:
    """The JVM exited abnormally before TLC printed a single message (TLC's first one is its version)."""
    return result.exit_code not in (None, 0) and not result.messages


def _execute(command: list[str], run_dir: Path, timeout: float | None, cancel: threading.Event | None,
             progress: Callable[[Progress], None] | None, jar_overridden: bool, *, spec: Path,
             cfg_text: str, end_after_report: bool = False) -> TlcResult:
    started = time.monotonic()

    def on_message(message: TlcMessage) -> None:
        if message.code == Code.VERSION:
            log.log(logging.INFO if jar_overridden else logging.DEBUG, "TLC version: %s", message.text.strip())
        elif message.code in (Code.PROGRESS, Code.SIMULATION_PROGRESS) and progress is not None:
            progress(parse_progress(message.text, time.monotonic() - started))

    stream = MessageStream(on_message)
    output: list[str] = []
    log.debug("running %s in %s", " ".join(command), run_dir)
    process = subprocess.Popen(command, cwd=run_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True, encoding="utf-8", errors="replace",
                               start_new_session=True)
    watchdog = _Watchdog(process, None if timeout is None else started + timeout, cancel)
    watchdog.start()
    ended = False
    reported: int | None = None
    try:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            stream.feed(line)
            if end_after_report and reported is None:
                reported = reported_exit_status(stream)
                if reported is not None:
                    ended = _end_after_report(process)  # the loop then reads whatever is left, up to EOF
        exit_code = process.wait()
        if ended:
            log.debug("TLC's report is complete (exit status %s): JVM ended without waiting for its shutdown",
                      reported)
            exit_code = reported
    finally:
        watchdog.done.set()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        watchdog.join()
    seconds = time.monotonic() - started
    stream.close()

    def module_path(module: str) -> str:
        return str(spec.parent / f"{module}.tla")

    if watchdog.reason is not None:
        counts = interpret(stream, None, cfg_text=cfg_text, module_path=module_path)
        what = "timed out after" if watchdog.reason is Kind.TIMEOUT else "cancelled after"
        so_far = f" ({counts.distinct_states} distinct states so far)" if counts.distinct_states is not None else ""
        return TlcResult(
            status=Status.ERROR, kind=watchdog.reason, property=None,
            distinct_states=counts.distinct_states, generated_states=counts.generated_states,
            depth=counts.depth, seconds=seconds, trace=[], loop_index=None,
            message=f"TLC {what} {seconds:.1f} s{so_far}", exit_code=None, spec=spec, config=None,
            tlc_version=counts.tlc_version, search_seconds=counts.search_seconds, output="".join(output),
            messages=stream.messages, command=command,
        )
    verdict = interpret(stream, exit_code, cfg_text=cfg_text, module_path=module_path)
    return TlcResult(
        status=verdict.status, kind=verdict.kind, property=verdict.property,
        distinct_states=verdict.distinct_states, generated_states=verdict.generated_states,
        depth=verdict.depth, seconds=seconds, trace=verdict.trace, loop_index=verdict.loop_index,
        message=verdict.message, exit_code=exit_code, spec=spec, config=None, tlc_version=verdict.tlc_version,
        stuttering=verdict.stuttering, search_seconds=verdict.search_seconds, output="".join(output),
        messages=stream.messages, command=command, ended_after_report=ended,
    )
