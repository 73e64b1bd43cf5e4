"""The tiny model with seeded random weights in real vLLM: it loads with the default loader, greedy
decoding is repeatable, and its logits are sharp (the output oracle needs outputs that depend on the KV)."""
from __future__ import annotations

import math
from pathlib import Path

from vllm import SamplingParams

from vllm_harness import VOCAB_SIZE, running_llm, token_prompts, write_tiny_model


def test_random_weights_load_and_give_sharp_repeatable_greedy_outputs(vllm_root: Path) -> None:
    model = write_tiny_model(vllm_root / "tiny-llama-random-weights", seed=3)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=1)
    prompts = token_prompts(2, 40, seed=11)
    with running_llm(model, None, load_format="auto") as llm:
        first = llm.generate(prompts, params, use_tqdm=False)
        llm.reset_prefix_cache()
        again = llm.generate(prompts, params, use_tqdm=False)
    for one, two in zip(first, again):
        assert one.outputs[0].token_ids == two.outputs[0].token_ids
    chosen = [
        step[token].logprob
        for output in first
        for token, step in zip(output.outputs[0].token_ids, output.outputs[0].logprobs)
    ]
    uniform = -math.log(VOCAB_SIZE)  # what load_format="dummy" gives every token, nearly
    assert sum(chosen) / len(chosen) > uniform + 2, chosen
    assert len({tuple(output.outputs[0].token_ids) for output in first}) == 2  # distinct prompts, distinct outputs
