"""The watch's vLLM-free parts: its config, the scribble's targets and write, the output oracle, verdicts."""
from __future__ import annotations

import pytest
import torch

from deferdump.reference.errors import ConfigError
from deferdump.tools.watch.config import WatchConfig, watch_transfer_config
from deferdump.tools.watch.fresh import fresh_blocks, step_fresh_blocks
from deferdump.tools.watch.oracle import first_mismatch
from deferdump.tools.watch.scribble import SCRIBBLE_VALUE, scribble_blocks
from deferdump.tools.watch.verdict import ScenarioResult

INNER = {"kv_connector": "ExampleConnector", "kv_connector_extra_config": {"shared_storage_path": "/x"}}


def test_config_round_trip() -> None:
    transfer = watch_transfer_config(INNER, hma=True, log_dir="/logs", scribble=True)
    assert transfer["kv_connector"] == "WatchConnectorHMA"
    assert transfer["kv_connector_module_path"] == "deferdump.tools.watch.wrapper"
    config = WatchConfig.from_extra_config(transfer["kv_connector_extra_config"])
    assert (config.inner, config.log_dir, config.scribble) == (INNER, "/logs", True)
    assert watch_transfer_config(INNER, hma=False)["kv_connector"] == "WatchConnector"
    assert WatchConfig.from_extra_config({"inner": INNER}).scribble is False  # opt-in


@pytest.mark.parametrize("extra, key", [
    ({"inner": INNER, "scribel": True}, "scribel"),
    ({}, "inner"),
    ({"inner": {"kv_connector": ""}}, "inner"),
    ({"inner": {**INNER, "kv_conector_extra_config": {}}}, "inner.kv_conector_extra_config"),
    ({"inner": {**INNER, "kv_connector_module_path": ""}}, "inner.kv_connector_module_path"),
    ({"inner": {**INNER, "kv_connector_extra_config": [1]}}, "inner.kv_connector_extra_config"),
    ({"inner": INNER, "log_dir": 3}, "log_dir"),
    ({"inner": INNER, "scribble": "yes"}, "scribble"),
])
def test_bad_config_names_the_key(extra: dict, key: str) -> None:
    with pytest.raises(ConfigError) as error:
        WatchConfig.from_extra_config(extra)
    assert key in str(error.value)


def test_fresh_blocks_skip_local_hits_and_the_null_block() -> None:
    assert fresh_blocks([[5, 6, 7, 8]], 2) == [7, 8]
    assert fresh_blocks([[5, 6, 7], [0, 9, 10]], 1) == [6, 7, 9, 10]  # every group, position-aligned
    new = [("a", [[1, 2, 3]]), ("b", [[4, 5]]), ("unknown", [[11]])]
    cached = [("a", False, [[20]]), ("c", True, [[30, 31]]), ("d", True, [[40]])]
    hits = {"a": 32, "b": 0, "c": 64}
    # a: first block a local hit; b: all fresh; unknown new request: skipped; running a: its new block;
    # resumed c: both positions local hits; resumed d without a known hit: skipped.
    assert step_fresh_blocks(new, cached, hits, 32) == [2, 3, 4, 5, 20]


@pytest.mark.parametrize("shape, dim", [((6, 2, 4, 8), 0), ((2, 6, 4, 2, 4), 1)])  # CPU and CUDA layouts
def test_scribble_fills_exactly_the_named_blocks(shape: tuple[int, ...], dim: int) -> None:
    tensor = torch.arange(torch.tensor(shape).prod().item(), dtype=torch.float32).reshape(shape)
    before = tensor.clone()
    scribble_blocks([tensor, tensor], 6, [1, 4])  # the same tensor twice (shared by two groups' layers)
    for block in range(6):
        expected = torch.full_like(before.select(dim, block), SCRIBBLE_VALUE) if block in (1, 4) else before.select(dim, block)
        assert torch.equal(tensor.select(dim, block), expected)


def test_oracle_compares_tokens_and_logprobs_bitwise() -> None:
    base = {"0/p0": ((5, -0.5), (6, -1.25)), "0/p1": ((7, -0.1),)}
    assert first_mismatch(base, dict(base)) is None
    ulp = {**base, "0/p0": ((5, -0.5), (6, -1.2500000000000002))}
    assert first_mismatch(base, ulp) == ("prompt 0/p0: token 1: expected 6 (logprob -1.25), "
                                         "got 6 (logprob -1.2500000000000002)")
    assert first_mismatch(base, {**base, "0/p1": ((8, -0.1),)}).startswith("prompt 0/p1: token 0: expected 7")
    assert first_mismatch(base, {"0/p0": base["0/p0"]}) == "prompt 0/p1: no output with the connector"
    assert first_mismatch(base, {**base, "0/p1": ()}) == "prompt 0/p1: 0 tokens, expected 1"


def test_verdicts() -> None:
    result = ScenarioResult("prefix", "crash", "FileNotFoundError: x")
    assert ScenarioResult.from_json(result.as_json()) == result
    with pytest.raises(ValueError):
        ScenarioResult("prefix", "fine")
