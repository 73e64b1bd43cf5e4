"""One vLLM "node" on a shared Redis store (run as a script, one process per node).

Usage: python redis_node_driver.py MODEL_DIR REDIS_URL NAMESPACE RESULT_JSON

Builds an in-process engine whose connector uses `"store": "redis"`, generates greedy outputs for fixed
prompts, drains (every delayed free processed, every dump waited), and writes the outputs, vLLM's cached
token counts and the connector's counters to RESULT_JSON before shutting down.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from vllm_harness import (
    BLOCK_SIZE,
    build_llm,
    deferdump_connectors,
    deferdump_transfer_config,
    drain,
    greedy,
    metric,
    scheduler_connector,
    shutdown,
    token_prompts,
    worker_connector,
)

PROMPTS = token_prompts(3, 100, seed=71)  # 3 full blocks of 32 tokens each, and a partial one
MAX_TOKENS = 12


def main(model_dir: str, redis_url: str, namespace: str, result_path: str) -> None:
    extra = {"store": "redis", "redis_url": redis_url, "redis_namespace": namespace, "verify_dumps": True}
    llm = build_llm(Path(model_dir), deferdump_transfer_config(extra))
    try:
        [scheduler] = deferdump_connectors(scheduler_connector(llm))
        [worker] = deferdump_connectors(worker_connector())
        outputs = llm.generate(PROMPTS, greedy(MAX_TOKENS), use_tqdm=False)
        cached = [output.num_cached_tokens for output in outputs]
        tokens = [list(output.outputs[0].token_ids) for output in outputs]
        drain(llm)  # every delayed free processed: every dump task waited
        counters = {
            name: metric(connector, f"deferdump_{name}")
            for connector, names in (
                (scheduler, ("external_hit_tokens_total",)),
                (worker, ("dumps_submitted_total", "dumps_completed_total", "loads_completed_total",
                          "load_error_blocks_total", "verify_mismatches_total", "pending_dump_tasks",
                          "live_event_handles", "finished_sending_total")),
            )
            for name in names
        }
        result = {"outputs": tokens, "cached": cached, "counters": counters, "block_size": BLOCK_SIZE}
    finally:
        shutdown(llm)
    Path(result_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:5])
