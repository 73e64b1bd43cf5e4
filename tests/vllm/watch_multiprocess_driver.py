"""The watching wrapper in vLLM's default multiprocess mode (a script: spawn needs a __main__ guard).

Usage: python watch_multiprocess_driver.py MODEL_DIR STORE_DIR LOG_DIR RESULT_JSON

ExampleConnector inside the wrapper (boundary log, scribble on): prompts served, the prefix cache reset,
the same prompts served again from the connector. Writes both rounds' greedy tokens and this process's
pid to RESULT_JSON.
"""
from __future__ import annotations

import json
import os
import sys
import time


def main(model_dir: str, store_dir: str, log_dir: str, result_path: str) -> None:
    os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default: multiprocess
    from vllm import LLM, SamplingParams

    from deferdump.tools.watch.config import watch_transfer_config
    from deferdump.tools.watch.scenarios import SCENARIOS, engine_kwargs

    inner = {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"shared_storage_path": store_dir}}
    llm = LLM(**engine_kwargs(model_dir, SCENARIOS["prefix"]),
              kv_transfer_config=watch_transfer_config(inner, hma=False, log_dir=log_dir, scribble=True))
    prompts = [{"prompt_token_ids": tokens} for _, tokens in SCENARIOS["prefix"].rounds[0].prompts]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    first = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    deadline = time.monotonic() + 120
    while not llm.reset_prefix_cache():  # the engine process drains delayed frees by itself
        if time.monotonic() > deadline:
            raise RuntimeError("reset_prefix_cache refused for 120 s")
        time.sleep(0.2)
    second = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    with open(result_path, "w") as out:
        json.dump({"first": first, "second": second, "pid": os.getpid(),
                   "engine_client": type(llm.llm_engine.engine_core).__name__}, out)
    llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
