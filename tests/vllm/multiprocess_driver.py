"""The prefix scenario in vLLM's default multiprocess mode (run as a script: spawn needs a __main__ guard).

Usage: python multiprocess_driver.py MODEL_DIR STORE_DIR METRICS_DIR RESULT_JSON

The scheduler-side connector lives in the engine process and the worker side in a worker process, so
they share only the FileStore directory; each writes its Prometheus metrics to METRICS_DIR at shutdown.
Writes the greedy outputs of both runs, vLLM's cached-token counts of the second, and where the engine
and the worker-side connector ran (neither in this process) to RESULT_JSON.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from vllm_harness import deferdump_transfer_config, greedy, token_prompts

PROMPTS = token_prompts(3, 100, seed=61)
MAX_TOKENS = 12


def _reset_prefix_cache(llm, timeout_s: float = 60.0) -> int:
    """vLLM refuses while delayed frees still hold blocks; the engine process drains them by itself."""
    attempts = 0
    deadline = time.monotonic() + timeout_s
    while True:
        attempts += 1
        if llm.reset_prefix_cache():
            return attempts
        if time.monotonic() > deadline:
            raise RuntimeError(f"reset_prefix_cache still refused after {attempts} attempts")
        time.sleep(0.2)


def main(model_dir: str, store_dir: str, metrics_dir: str, result_path: str) -> None:
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default: multiprocess
    from vllm import LLM
    from vllm.distributed.kv_transfer import has_kv_transfer_group

    extra = {"store": "file", "store_path": store_dir, "verify_dumps": True, "metrics_dir": metrics_dir}
    llm = LLM(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        max_model_len=256,
        block_size=32,
        kv_cache_memory_bytes=16 << 20,
        kv_transfer_config=deferdump_transfer_config(extra),
    )
    engine_client = type(llm.llm_engine.engine_core).__name__
    worker_connector_here = has_kv_transfer_group()
    first = [list(out.outputs[0].token_ids) for out in llm.generate(PROMPTS, greedy(MAX_TOKENS), use_tqdm=False)]
    attempts = _reset_prefix_cache(llm)
    outputs = llm.generate(PROMPTS, greedy(MAX_TOKENS), use_tqdm=False)
    second = [list(out.outputs[0].token_ids) for out in outputs]
    cached = [out.num_cached_tokens for out in outputs]
    _reset_prefix_cache(llm)  # every delayed free of the second run processed before shutdown
    llm.llm_engine.engine_core.shutdown()  # both connectors shut down and write their metrics
    Path(result_path).write_text(
        json.dumps(
            {
                "first": first,
                "second": second,
                "cached": cached,
                "reset_attempts": attempts,
                "engine_client": engine_client,
                "worker_connector_in_driver": worker_connector_here,
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:5])
