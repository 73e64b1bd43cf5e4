"""Run scenarios, each in a child process with a timeout, and collect their verdicts.

A crashed engine, a hung one, or one that takes the interpreter down cannot take the caller with it: the
child (`deferdump.tools.watch.runner`) writes its verdict to a file; no file within the timeout is a
`hang`, a child that died without one is a `crash` named by its last error line.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from deferdump.tools.watch.verdict import CRASH, HANG, ScenarioResult

RUNNER = "deferdump.tools.watch.runner"


def child_env(work: Path, cache: Path | None = None) -> dict[str, str]:
    """vLLM in-process, everything it writes under `work`, no usage reports; torch's compiled kernels
    under `cache` when given (vLLM's CPU path compiles C++ through inductor: minutes on a busy machine,
    once per cache instead of once per scenario)."""
    env = dict(os.environ)
    if cache is not None and "TORCHINDUCTOR_CACHE_DIR" not in env:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
    for name in ("TMPDIR", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "HF_HOME"):
        path = work / name.lower()
        path.mkdir(parents=True, exist_ok=True)
        env[name] = str(path)
    env.update(VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    return env


def run_scenario(scenario: str, inner: Mapping[str, Any], *, hma: bool, scribble: bool, timeout: float,
                 hang_after: float, work_root: Path, keep: bool = False, runner: str = RUNNER,
                 baseline_cache: Path | None = None) -> ScenarioResult:
    """One scenario's verdict, from a child process (`python -m <runner> SPEC`) given `timeout` seconds."""
    work = Path(tempfile.mkdtemp(prefix=f"watch-{scenario}-", dir=work_root))
    spec = {"scenario": scenario, "inner": dict(inner), "hma": hma, "scribble": scribble,
            "work_dir": str(work), "hang_after": hang_after,
            "baseline_cache": None if baseline_cache is None else str(baseline_cache)}
    (work / "spec.json").write_text(json.dumps(spec))
    result_path = work / "result.json"
    log_path = work / "child.log"
    try:
        with open(log_path, "wb") as log:
            process = subprocess.Popen([sys.executable, "-m", runner, str(work / "spec.json")], stdout=log,
                                       stderr=subprocess.STDOUT, env=child_env(work, baseline_cache),
                                       start_new_session=True)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()
                if not result_path.exists():
                    return ScenarioResult(scenario, HANG, f"no verdict within {timeout:g} s: the engine process was killed")
        if result_path.exists():
            return ScenarioResult.from_json(json.loads(result_path.read_text()))
        return ScenarioResult(scenario, CRASH, f"the engine process died (exit {process.returncode}): "
                              f"{last_error_line(log_path)}")
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def last_error_line(log_path: Path) -> str:
    """The last line that looks like an exception in a child's output (else its last line)."""
    lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines):
        head = line.split(":", 1)[0]
        if head.endswith(("Error", "Exception")) or head in ("Killed", "Segmentation fault"):
            return line[:400]
    return lines[-1][:400] if lines else "no output"


def run_scenarios(scenarios: Iterable[str], inner: Mapping[str, Any], *, hma: bool, scribble: bool,
                  timeout: float, hang_after: float, work_root: Path | None = None, keep: bool = False,
                  baseline_cache: Path | None = None, progress: Callable[[str, ScenarioResult | None], None] | None = None) -> list[ScenarioResult]:
    """Every scenario's verdict, in order; `progress(name, None)` before and `(name, result)` after each."""
    root = Path(work_root) if work_root is not None else Path(tempfile.mkdtemp(prefix="deferdump-watch-"))
    root.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for name in scenarios:
            if progress is not None:
                progress(name, None)
            result = run_scenario(name, inner, hma=hma, scribble=scribble, timeout=timeout, hang_after=hang_after,
                                  work_root=root, keep=keep, baseline_cache=baseline_cache)
            results.append(result)
            if progress is not None:
                progress(name, result)
    finally:
        if work_root is None and not keep:
            shutil.rmtree(root, ignore_errors=True)
    return results
