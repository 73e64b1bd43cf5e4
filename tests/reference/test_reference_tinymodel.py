"""The tiny model's random weights: every Llama parameter, seeded, and the config written as given."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from deferdump.reference.errors import ConfigError
from deferdump.reference.testing.tinymodel import (
    TINY_HYBRID_CONFIG,
    TINY_LLAMA_CONFIG,
    llama_weight_shapes,
    random_llama_weights,
    write_tiny_model,
)


def test_shapes_cover_every_llama_parameter_of_the_config() -> None:
    shapes = llama_weight_shapes(TINY_LLAMA_CONFIG)
    layers = TINY_LLAMA_CONFIG["num_hidden_layers"]
    assert len(shapes) == 3 + 9 * layers  # embed, final norm, lm_head; nine per layer
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (2 * 32, 128)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (128, 256)
    assert "lm_head.weight" not in llama_weight_shapes({**TINY_LLAMA_CONFIG, "tie_word_embeddings": True})


def test_the_same_seed_gives_the_same_weights_and_another_seed_others() -> None:
    first = random_llama_weights(TINY_LLAMA_CONFIG, seed=7, std=0.2)
    again = random_llama_weights(TINY_LLAMA_CONFIG, seed=7, std=0.2)
    other = random_llama_weights(TINY_LLAMA_CONFIG, seed=8, std=0.2)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["model.embed_tokens.weight"], other["model.embed_tokens.weight"])
    matrix = first["model.layers.0.self_attn.q_proj.weight"]
    assert 0.18 < float(matrix.std()) < 0.22  # 16k draws: the std is within a few percent of 0.2
    assert torch.equal(first["model.norm.weight"], torch.ones(128))


def test_config_only_writes_no_weights(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "m", TINY_HYBRID_CONFIG, weights="none")
    assert json.loads((model / "config.json").read_text()) == TINY_HYBRID_CONFIG
    assert [p.name for p in model.iterdir()] == ["config.json"]


def test_an_unknown_weights_kind_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="weights: must be"):
        write_tiny_model(tmp_path / "m", weights="dummy")  # type: ignore[arg-type]
