"""`deferdump bench --load-async`'s figure: one request stream with store hits, synchronous then asynchronous
loads; the asynchronous run parks its hits (WAITING_FOR_REMOTE_KVS) and completes their loads."""
from __future__ import annotations

import logging

from deferdump.tools.bench.load_modes import measure_load_modes


def test_load_modes_run_the_same_stream_with_sync_and_async_loads() -> None:
    logging.getLogger("deferdump.reference").setLevel(logging.ERROR)
    figures = measure_load_modes(20)["load_modes"]
    sync, parked = figures["sync"], figures["async"]
    assert sync["requests"] == parked["requests"] == 20
    assert sync["parked"] == 0 and sync["loads_completed"] == 20  # the warmed store: every prompt hits
    assert parked["parked"] == parked["loads_completed"] == 20  # every hit parked, and its load completed
    for run in (sync, parked):
        assert run["start_load_kv_ms_per_step_mean"] is not None and run["wall_s"] > 0
