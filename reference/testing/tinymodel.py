"""A tiny Llama on disk, with seeded random weights, for end-to-end runs in vLLM that compare outputs.

vLLM's `load_format="dummy"` fills weights so that the logits are nearly uniform: greedy outputs then
barely depend on the KV cache, and an oracle comparing a run served from a connector with one without
it is blind. Random normal weights (std 0.2, seeded) make the outputs sharp: scaling one layer's stored
KV or swapping one token's K/V changes the tokens, a one-ULP change does not
(../shared/notes/third-party-connectors.md, "A black-box oracle for any connector").

No downloads: the config is written by hand and the weights drawn here. Writing weights needs `torch`
and `safetensors` (both come with vLLM); they are imported only when weights are asked for.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from deferdump.reference.errors import ConfigError

VOCAB_SIZE = 512

#: A Llama the CPU attention backend accepts (head size 32), small enough to build in milliseconds.
TINY_LLAMA_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "head_dim": 32,  # the CPU attention backend rejects head size 16
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "intermediate_size": 256,
    "vocab_size": VOCAB_SIZE,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
}

#: Tokens a sliding-window layer of the hybrid model attends to (below the tests' block size of 32).
SLIDING_WINDOW = 16

#: The tiny Llama as a hybrid model: layer 0 attends within a sliding window, layer 1 is full attention.
#: With a `SupportsHMA` connector vLLM keeps its hybrid KV-cache manager on: two KV-cache groups, and the
#: sliding-window group's blocks are freed while their request runs.
TINY_HYBRID_CONFIG: dict[str, Any] = {
    **TINY_LLAMA_CONFIG,
    "sliding_window": SLIDING_WINDOW,
    "layer_types": ["sliding_attention", "full_attention"],
}

#: The tiny Llama with every layer sliding-window: vLLM keeps one SlidingWindowSpec group (promotion to full
#: attention happens only beside full-attention layers), with or without `SupportsHMA`, and frees a running
#: request's blocks as they leave the window.
TINY_SLIDING_CONFIG: dict[str, Any] = {
    **TINY_LLAMA_CONFIG,
    "sliding_window": SLIDING_WINDOW,
    "layer_types": ["sliding_attention", "sliding_attention"],
}

#: The file vLLM's default loader (`load_format="auto"`) finds first.
WEIGHTS_FILE = "model.safetensors"

Weights = Literal["random", "none"]


def llama_weight_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every parameter of a `LlamaForCausalLM` with `config`, by the name vLLM's loader expects."""
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim", hidden // int(config["num_attention_heads"])))
    q_out = int(config["num_attention_heads"]) * head_dim
    kv_out = int(config["num_key_value_heads"]) * head_dim
    inter = int(config["intermediate_size"])
    vocab = int(config["vocab_size"])
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for layer in range(int(config["num_hidden_layers"])):
        prefix = f"model.layers.{layer}"
        shapes.update({
            f"{prefix}.self_attn.q_proj.weight": (q_out, hidden),
            f"{prefix}.self_attn.k_proj.weight": (kv_out, hidden),
            f"{prefix}.self_attn.v_proj.weight": (kv_out, hidden),
            f"{prefix}.self_attn.o_proj.weight": (hidden, q_out),
            f"{prefix}.mlp.gate_proj.weight": (inter, hidden),
            f"{prefix}.mlp.up_proj.weight": (inter, hidden),
            f"{prefix}.mlp.down_proj.weight": (hidden, inter),
            f"{prefix}.input_layernorm.weight": (hidden,),
            f"{prefix}.post_attention_layernorm.weight": (hidden,),
        })
    if not config.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def random_llama_weights(config: Mapping[str, Any], *, seed: int, std: float) -> dict[str, Any]:
    """Seeded weights: matrices drawn from N(0, std²), norm scales 1 (the same seed gives the same bytes)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    tensors: dict[str, Any] = {}
    for name, shape in sorted(llama_weight_shapes(config).items()):
        if len(shape) == 1:  # RMSNorm scales: a random scale would only rescale, and may flip signs
            tensors[name] = torch.ones(shape, dtype=torch.float32)
        else:
            tensors[name] = torch.randn(shape, generator=generator, dtype=torch.float32) * std
    return tensors


def write_tiny_model(
    directory: Path,
    config: Mapping[str, Any] = TINY_LLAMA_CONFIG,
    *,
    weights: Weights = "random",
    seed: int = 0,
    std: float = 0.2,
) -> Path:
    """Write the tiny decoder to `directory`: `config.json`, and with `weights="random"` its weights.

    Load a model with weights with vLLM's default `load_format`; `weights="none"` writes only the config,
    for `load_format="dummy"` runs whose outputs are not compared.
    """
    if weights not in ("random", "none"):
        raise ConfigError("weights", f"must be 'random' or 'none', not {weights!r}")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(dict(config), indent=2))
    if weights == "random":
        from safetensors.torch import save_file

        tensors = random_llama_weights(config, seed=seed, std=std)
        save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt", "seed": str(seed), "std": repr(std)})
    return directory
