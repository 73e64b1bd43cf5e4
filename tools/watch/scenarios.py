"""The catalogue of `deferdump watch` scenarios: workloads run in real (CPU) vLLM, in-process.

Each scenario runs its workload twice, on the tiny Llama with random weights: once with no connector
(the oracle's reference outputs) and once with the inner connector inside the watching wrapper (boundary
log, scribble as asked). Requests are added and stepped by hand (`LLMEngine.add_request` / `step`), so a
workload can abort or preempt at a chosen step, and the engine is stepped until it holds no request
(delayed frees included) before a round ends.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deferdump.reference.testing.tinymodel import TINY_HYBRID_CONFIG, TINY_LLAMA_CONFIG, VOCAB_SIZE

BLOCK_SIZE = 32

#: A round: (prompt name, token ids) to submit, and what the driver does while stepping.
Prompts = list[tuple[str, list[int]]]


@dataclass(frozen=True)
class Round:
    """Prompts submitted together and stepped to the end; `reset_before`: reset the prefix cache first
    (so repeated prompts must come from the connector); `abort_at_step`: abort `abort` after that many
    steps; `preempt_all_at_step`: preempt every running request (vLLM's reset_running_requests) then."""

    prompts: Prompts
    max_tokens: int
    reset_before: bool = False
    abort_at_step: int | None = None
    abort: tuple[str, ...] = ()
    preempt_all_at_step: int | None = None


@dataclass(frozen=True)
class Scenario:
    name: str
    about: str
    rounds: tuple[Round, ...]
    engine: Mapping[str, Any] = field(default_factory=dict)  # LLM(...) overrides
    hybrid: bool = False  # the tiny hybrid model; only for HMA connectors
    multi: bool = False  # the inner connector as one of two MultiConnector children


def token_prompts(names: str, count: int, length: int, *, seed: int) -> Prompts:
    """`count` distinct prompts of `length` token ids, named `<names><i>`."""
    import random

    rng = random.Random(seed)
    return [(f"{names}{i}", [rng.randrange(3, VOCAB_SIZE) for _ in range(length)]) for i in range(count)]


def _catalogue() -> dict[str, Scenario]:
    # Small on purpose: each scenario builds two engines, and a 2-core machine steps ~2-10 times a second.
    prefix = token_prompts("p", 3, 70, seed=1)  # two full blocks each: something to save and load
    preempt = token_prompts("q", 6, 100, seed=2)
    # a long request and a short one that together outgrow the pool (see the `preempt` scenario)
    evict = token_prompts("e", 1, 100, seed=7) + [("e1", token_prompts("f", 1, 70, seed=8)[0][1])]
    victims = token_prompts("v", 3, 70, seed=3)
    aborts = token_prompts("a", 2, 160, seed=4)
    window = token_prompts("w", 8, 70, seed=5)
    return {s.name: s for s in (
        Scenario("prefix", "prompts saved, the prefix cache reset, the same prompts served again",
                 (Round(prefix, 4), Round(prefix, 4, reset_before=True))),
        # 8 usable blocks of 32 tokens. Round 1: 6 requests of 100 + 60 tokens (5 blocks each), 3 preemptions
        # (shared/notes/vllm-cpu-e2e.md, "Forcing preemption"); freed blocks are handed on at once, but the
        # resumed requests find their prompt blocks in vLLM's local prefix cache. Round 2 makes a resume miss
        # that cache: e0 (100 tokens) and e1 (70) each grow to 8 blocks (156 new tokens); e0 needs its 5th
        # block when none is free, so vLLM preempts e1 (the last running), and e0's blocks 6-8 are e1's
        # freed ones (prefix hashes evicted): e1 resumes from the connector, if it saved its prompt (where
        # ExampleConnector names the file after prompt + output and crashes, example_connector.py ~354-383).
        Scenario("preempt", "preemption and resume under a small KV cache, a resume served by the connector, "
                 "then the prompts again",
                 (Round(preempt, 60), Round(evict, 156, reset_before=True), Round(preempt, 4, reset_before=True)),
                 engine={"num_gpu_blocks_override": 9}),
        Scenario("several_victims", "every running request preempted in one step, resumed, then served again",
                 (Round(victims, 8, preempt_all_at_step=3), Round(victims, 4, reset_before=True))),
        Scenario("abort", "a request aborted mid-prefill while its first blocks' saves may be pending",
                 (Round(aborts, 4, abort_at_step=1, abort=("a0",)), Round(aborts, 4, reset_before=True)),
                 engine={"max_num_batched_tokens": 64}),
        Scenario("sliding_window", "the hybrid model (a sliding-window layer): blocks freed while running",
                 # 40 usable blocks for two groups: requests queue, and a prompt block that leaves the 16-token
                 # window (past token 80) is handed to a waiting request at once, while its owner still runs
                 # (as tests/vllm/test_vllm_sliding_window.py).
                 (Round(window, 40), Round(window, 4, reset_before=True)), hybrid=True,
                 engine={"num_gpu_blocks_override": 41}),
        Scenario("multi", "the inner connector as one of two MultiConnector children",
                 (Round(prefix, 4), Round(prefix, 4, reset_before=True)), multi=True),
    )}


SCENARIOS: dict[str, Scenario] = _catalogue()


def skip_reason(scenario: Scenario, hma: bool) -> str | None:
    """Why `scenario` does not apply to a connector (None: it applies)."""
    if scenario.hybrid and not hma:
        return "needs an HMA connector (SupportsHMA): vLLM runs a non-HMA connector without the hybrid KV-cache manager"
    return None


def multi_inner(inner: Mapping[str, Any], store_dir: Path) -> dict[str, Any]:
    """The inner kv_transfer_config as the first of two MultiConnector children (the second: vLLM's
    ExampleConnector on its own directory)."""
    child = copy.deepcopy(dict(inner))
    child.setdefault("kv_role", "kv_both")
    second = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
              "kv_connector_extra_config": {"shared_storage_path": str(store_dir / "multi-example")}}
    return {"kv_connector": "MultiConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"connectors": [child, second]}}


def model_config(scenario: Scenario) -> dict[str, Any]:
    return dict(TINY_HYBRID_CONFIG if scenario.hybrid else TINY_LLAMA_CONFIG)


def engine_kwargs(model_dir: Path, scenario: Scenario) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(model=str(model_dir), skip_tokenizer_init=True, enforce_eager=True,
                                  max_model_len=256, block_size=BLOCK_SIZE, kv_cache_memory_bytes=16 << 20, seed=0)
    kwargs.update(scenario.engine)
    return kwargs


def run_workload(llm: Any, scenario: Scenario, on_build: Callable[[Any], None] | None = None,
                 on_step: Callable[[], None] | None = None) -> dict[str, Any]:
    """Every round of `scenario` on `llm`: outputs by `<round>/<prompt>` as (token id, logprob) tuples.

    Aborted prompts have no output. `on_build` receives the in-process scheduler once and `on_step` is
    called after every engine step (the watchdog)."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    if on_build is not None:
        on_build(scheduler)
    outputs: dict[str, Any] = {}
    for index, round_ in enumerate(scenario.rounds):
        if round_.reset_before and not llm.reset_prefix_cache():
            raise RuntimeError("reset_prefix_cache refused after a drained round (blocks still held)")
        params = SamplingParams(max_tokens=round_.max_tokens, temperature=0.0, ignore_eos=True, logprobs=0)
        for name, tokens in round_.prompts:
            engine.add_request(f"r{index}-{name}", {"prompt_token_ids": tokens}, params)
        step = 0
        while engine.has_unfinished_requests() or scheduler.has_requests():
            if step == round_.abort_at_step:
                engine.abort_request([f"r{index}-{name}" for name in round_.abort])
            if step == round_.preempt_all_at_step:
                engine.reset_prefix_cache(reset_running_requests=True)
            for output in engine.step():
                if output.finished:
                    name = output.request_id.split("-", 1)[1]
                    if name in round_.abort:
                        continue
                    completion = output.outputs[0]
                    outputs[f"{index}/{name}"] = tuple(
                        (int(token), float(logprobs[token].logprob))
                        for token, logprobs in zip(completion.token_ids, completion.logprobs or ()))
            if on_step is not None:
                on_step()
            step += 1
    return outputs
