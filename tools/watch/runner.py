"""One scenario in one process: `python -m deferdump.tools.watch.runner SPEC.json` writes the verdict beside it.

The parent (`deferdump.tools.watch.session`) starts this module in a child process with a timeout, so a
crashed or hung engine never takes the command down. Here: the reference run without a connector, the
run through the watching wrapper under a watchdog, then the contract check of the boundary log and the
output oracle. The spec: `{"scenario", "inner", "hma", "scribble", "work_dir", "hang_after"}`, optionally
`"baseline_cache"` (a directory keeping the reference outputs); the result
(`result.json` in `work_dir`): `{"scenario", "verdict", "detail"}`.
"""
from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from deferdump.conformance.contractlog import check_contract_log
from deferdump.tools.watch.config import watch_transfer_config
from deferdump.tools.watch.oracle import first_mismatch
from deferdump.tools.watch.scenarios import (
    SCENARIOS,
    Scenario,
    engine_kwargs,
    model_config,
    multi_inner,
    run_workload,
    skip_reason,
)
from deferdump.tools.watch.verdict import CONTRACT, CRASH, MISMATCH, OK, SKIPPED, UNKNOWN, ScenarioResult
from deferdump.tools.watch.watchdog import Watchdog

logger = logging.getLogger(__name__)
RESULT_FILE = "result.json"


def one_line(exc: BaseException) -> str:
    """The root cause of `exc` as `Type: message` on one line (vLLM wraps a connector's exception)."""
    seen = set()
    while True:
        nxt = exc.__cause__ or exc.__context__
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(exc))
        exc = nxt
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}"[:400] if message else type(exc).__name__


def write_result(path: Path, result: ScenarioResult) -> None:
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(result.as_json()))
    os.replace(partial, path)


def _run_engine(kwargs: dict[str, Any], scenario: Scenario, watchdog: Watchdog | None) -> dict[str, Any]:
    from vllm import LLM
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm = LLM(**kwargs)
    try:
        if watchdog is None:
            return run_workload(llm, scenario)
        return run_workload(llm, scenario, watchdog.start, watchdog.stepped)
    finally:
        llm.llm_engine.engine_core.shutdown()
        cleanup_dist_env_and_memory()


def reference_outputs(kwargs: dict[str, Any], scenario: Scenario, cache_dir: str | None) -> dict[str, Any]:
    """The scenario's outputs without a connector; kept in `cache_dir` (when given) under a digest of
    everything they depend on (scenario, engine arguments, model file, vLLM and torch versions), logprobs
    stored as exact hex floats."""
    if cache_dir is None:
        return _run_engine(kwargs, scenario, None)
    import hashlib

    import torch
    import vllm

    model = Path(kwargs["model"])
    digest = hashlib.sha256(repr((scenario, sorted((k, str(v)) for k, v in kwargs.items() if k != "model"),
                                  (model / "config.json").read_bytes(), vllm.__version__, torch.__version__)).encode())
    for weights in sorted(model.glob("*.safetensors")):
        digest.update(weights.read_bytes())
    path = Path(cache_dir) / f"watch-reference-{scenario.name}-{digest.hexdigest()[:16]}.json"
    if path.exists():
        stored = json.loads(path.read_text())
        return {key: tuple((token, float.fromhex(logprob)) for token, logprob in value) for key, value in stored.items()}
    outputs = _run_engine(kwargs, scenario, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps({key: [(token, float(lp).hex()) for token, lp in value] for key, value in outputs.items()}))
    os.replace(partial, path)
    return outputs


def run(spec: dict[str, Any]) -> ScenarioResult:
    """The scenario's verdict (writes nothing; `main` does)."""
    from deferdump.reference.testing.tinymodel import write_tiny_model

    name = spec["scenario"]
    scenario = SCENARIOS[name]
    reason = skip_reason(scenario, spec["hma"])
    if reason is not None:
        return ScenarioResult(name, SKIPPED, reason)
    work = Path(spec["work_dir"])
    model = write_tiny_model(work / "model", model_config(scenario))
    kwargs = engine_kwargs(model, scenario)
    try:
        expected = reference_outputs(kwargs, scenario, spec.get("baseline_cache"))
    except Exception as exc:  # noqa: BLE001 - no connector involved: no verdict on it
        logger.exception("the reference run of %s failed", name)
        return ScenarioResult(name, UNKNOWN, f"the reference run without a connector failed: {one_line(exc)}")

    inner = multi_inner(spec["inner"], work) if scenario.multi else spec["inner"]
    hma = spec["hma"] and not scenario.multi or (scenario.multi and _multi_hma(inner))
    log_dir = work / "log"
    transfer = watch_transfer_config(inner, hma=hma, log_dir=str(log_dir), scribble=spec["scribble"])
    watchdog = Watchdog(name, float(spec["hang_after"]), lambda result: _end_hung(work / RESULT_FILE, result))
    try:
        got = _run_engine({**kwargs, "kv_transfer_config": transfer}, scenario, watchdog)
    except Exception as exc:  # noqa: BLE001 - any failure of the engine with the connector is the verdict
        watchdog.stop()
        logger.exception("scenario %s crashed", name)
        broken = _contract_before_crash(log_dir)
        if broken is not None:  # the connector broke the contract first (vLLM often asserts on it next)
            return ScenarioResult(name, CONTRACT, f"{broken}; then the engine crashed: {one_line(exc)}")
        return ScenarioResult(name, CRASH, one_line(exc))
    watchdog.stop()
    verdict = check_contract_log([log_dir], drained=True)  # run_workload stepped until no request was held
    if not verdict.ok:
        return ScenarioResult(name, CONTRACT, f"{verdict.property}: {verdict.detail}")
    mismatch = first_mismatch(expected, got)
    if mismatch is not None:
        return ScenarioResult(name, MISMATCH, mismatch)
    return ScenarioResult(name, OK, f"{len(got)} outputs bitwise equal to a run without a connector")


def _end_hung(result_path: Path, result: ScenarioResult) -> None:
    """Writes the `hang` verdict and ends the process: the engine cannot be stopped from here."""
    write_result(result_path, result)
    os._exit(0)


def _contract_before_crash(log_dir: Path) -> str | None:
    """The contract clause the log broke before a crash (None: none, or no readable log)."""
    from deferdump.reference.errors import DeferDumpError

    try:
        verdict = check_contract_log([log_dir], drained=False)
    except DeferDumpError:
        return None
    return None if verdict.ok else f"{verdict.property}: {verdict.detail}"


def _multi_hma(inner: dict[str, Any]) -> bool:
    from deferdump.tools.watch.resolve import resolve_inner

    return resolve_inner(inner)[1]


def main(argv: list[str]) -> int:
    spec_path = Path(argv[0])
    spec = json.loads(spec_path.read_text())
    result_path = Path(spec["work_dir"]) / RESULT_FILE
    logging.basicConfig(level=logging.WARNING)
    write_result(result_path, run(spec))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # vLLM's leftover threads must not keep a finished scenario alive


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
