"""`redis_dump_bandwidth_over_raw` on a tiny config: RedisStore's dump path and plain pipelined SETs of the
same bytes both ran against a real private redis-server (no timing assertion: speed is reported)."""
from __future__ import annotations

import math

from deferdump.tools.bench.suite import GOALS, measure_redis_bandwidth
from support.bench import tiny_config


def test_redis_bandwidth_figure_is_measured_against_raw_sets() -> None:
    figures = measure_redis_bandwidth(tiny_config())
    ratio = figures["redis_dump_bandwidth_over_raw"]
    assert isinstance(ratio, float) and math.isfinite(ratio) and ratio > 0
    assert figures["redis_dump_gbps"]["n"] == figures["redis_raw_set_gbps"]["n"] == tiny_config().bandwidth_repeats
    assert "RedisStore.dump" in figures["redis_bandwidth_path"]
    assert GOALS["redis_dump_bandwidth_over_raw"] == (">=", 0.80)
