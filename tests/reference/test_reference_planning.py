"""Scheduler planning as a property: under any chunking, every full prompt block beyond the store hit is
dumped exactly once, in order, in the step that fills it; the load range is exactly the hit."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from deferdump.reference import ConnectorConfig, DirectConnector, ManualStore, Role
from deferdump.reference.hashing import prefix_block_hashes
from support.reference import cached_req, new_req, request, step


@settings(max_examples=300, deadline=None)
@given(
    block_size=st.integers(1, 5),
    prompt=st.integers(1, 40),
    stored_blocks=st.integers(0, 8),
    cp=st.sampled_from([1, 2]),
    chunks=st.lists(st.integers(1, 9), min_size=1, max_size=40),
)
def test_chunked_prefill_plans_each_full_block_once(
    block_size: int, prompt: int, stored_blocks: int, cp: int, chunks: list[int]
) -> None:
    store = ManualStore()
    variant = "cp" if cp > 1 else "direct"
    sched = DirectConnector(
        ConnectorConfig(variant=variant, cp_world_size=cp, block_size=block_size), Role.SCHEDULER, store=store
    )
    req = request("r", prompt)
    hashes = prefix_block_hashes(req.token_ids, block_size, cp)
    full = prompt // block_size
    for h in hashes[: min(stored_blocks, full) * cp]:
        store._blocks[h] = torch.zeros(1, dtype=torch.uint8)
    external, _ = sched.get_num_new_matched_tokens(req, 0)
    hit = min(stored_blocks, full)
    assert external == (max(0, hit * block_size - 1) if hit == full and hit * block_size == prompt else hit * block_size)

    block_ids = list(range(100, 100 + -(-prompt // block_size)))
    sched.update_state_after_alloc(req, block_ids, external)
    computed, dumped_ids, dumped_hashes, loads, steps = external, [], [], [], 0
    allocated = 0
    while computed < prompt:
        n = min(chunks[steps % len(chunks)], prompt - computed)
        needed = -(-(computed + n) // block_size)
        new_blocks, allocated = block_ids[allocated:needed], needed
        view = step(new=[new_req(req, new_blocks, n, computed)]) if steps == 0 else step(
            cached=[cached_req("r", new_blocks, n, computed)]
        )
        meta = sched.build_connector_meta(view).request_meta.get("r")
        if meta is not None:
            loads.append((meta.load_hashes, meta.load_block_ids))
            dumped_ids += meta.dump_block_ids
            dumped_hashes += meta.dump_hashes
            assert all(b < needed for b in (x - 100 for x in meta.dump_block_ids))  # full in this step
            assert all((i + 1) * block_size <= computed + n for i in (x - 100 for x in meta.dump_block_ids))
        computed += n
        steps += 1
    assert dumped_ids == block_ids[hit:full]
    assert dumped_hashes == hashes[hit * cp : full * cp]
    expected_load = [(tuple(hashes[: hit * cp]), tuple(block_ids[:hit]))] if external else []
    assert [entry for entry in loads if entry[0]] == expected_load
    assert sched.request_finished(req, block_ids) == (bool(dumped_ids), None)
