"""The simulated engine's content checks: what each step must dump, and the bytes stores and loads hold.

With the forward's "tokens" content a block's bytes follow from its request's tokens alone
(`forward.slot_value`), and a block's store keys follow from the hashing rules (`reference/hashing.py`),
derived here independently of the connector. So the oracle knows, for every key a dump may store, the
bytes it must hold, and catches a dump that read its block after it was rewritten (`StoredBytes`) or a
load that restored something else (`LoadedBytes`). It also replays the scheduler's token accounting to
say which requests a step must give a dump slice (`DumpPlan`).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from deferdump.reference.config import ConnectorConfig
from deferdump.reference.groups import NULL_BLOCK, group_key
from deferdump.reference.hashing import layer_key, prefix_block_hashes, rank_key
from deferdump.reference.metadata import DeferDumpMetadata
from deferdump.reference.stores.base import BlockPayload

from deferdump.tools.engine.forward import ModelShape, slot_value
from deferdump.tools.engine.scheduler import ScheduledStep, SimRequest


class RecordingPayload:
    """Wraps a dump's payload to check the bytes the store actually consumed, the first time it does."""

    def __init__(self, inner: BlockPayload, keys: tuple[bytes, ...], oracle: "ContentOracle") -> None:
        self._inner = inner
        self._keys = keys
        self._oracle = oracle
        self._seen = False

    def done(self) -> bool:
        return self._inner.done()

    def result(self) -> torch.Tensor:
        rows = self._inner.result()
        if not self._seen:
            self._seen = True
            self._oracle.check_stored(self._keys, rows)
        return rows


class ContentOracle:
    """Expected store rows per key, the dump plan per request; violations collect in `violations`."""

    def __init__(self, connector: ConnectorConfig, shape: ModelShape, world_size: int, *, groups: int = 1) -> None:
        """`groups`: KV-cache groups (2: a hybrid model, whose group `g` holds layers `g, g + groups, ...` and
        stores its blocks under `group_key(key, g)`)."""
        self.connector = connector
        self.shape = shape
        self.world_size = world_size
        self.groups = groups
        self.per_block = world_size if connector.variant == "cp" else 1  # cp: one hash per rank per block
        self.layerwise = connector.variant == "layerwise" or (connector.variant == "cp" and connector.use_layerwise)
        self.expected_rows: dict[bytes, torch.Tensor] = {}
        self._processed: dict[str, int] = {}  # the plan's token_processed, per request
        self._planned_tokens: dict[str, int] = {}
        self.violations: list[str] = []

    # ------------------------------------------------------------------ plan
    def on_schedule(self, step: ScheduledStep, requests: dict[str, SimRequest], meta: DeferDumpMetadata) -> None:
        """Replay the step's token accounting: which requests get a dump slice, and learn their block bytes."""
        bs = self.shape.block_size
        dump_ids: set[str] = set()
        for chunk in step.chunks:
            request = requests[chunk.req_id]
            if chunk.admitted:
                self._processed[chunk.req_id] = -(-chunk.start // bs) * bs
                self._planned_tokens[chunk.req_id] = len(request.tokens)
                self._expect_blocks_of(request.tokens)
            processed, tokens = self._processed[chunk.req_id], self._planned_tokens[chunk.req_id]
            if not chunk.admitted and chunk.start < min(processed, tokens):  # rolled back after a failed load
                processed = chunk.start
            if processed < tokens:
                first = processed // bs
                last = min((processed + chunk.num_tokens) // bs, tokens // bs)
                if last > first:
                    dump_ids.add(chunk.req_id)
                self._processed[chunk.req_id] = processed + chunk.num_tokens
        if meta.dump_req_ids() != dump_ids:
            self.violations.append(
                f"DumpPlan (Python-only): a step gave dump slices to {sorted(meta.dump_req_ids())}, expected {sorted(dump_ids)}"
            )
        for req_id, dispatch in meta.request_meta.items():
            if len(dispatch.dump_block_ids) * self.per_block != len(dispatch.dump_hashes):
                self.violations.append(f"DumpPlan (Python-only): {req_id}'s dump hashes and blocks disagree")

    # ----------------------------------------------------------------- bytes
    def owner(self, rank: int) -> int:
        return 0 if self.connector.is_mla else rank  # MLA: every rank holds the same KV

    def block_rows(self, tokens: Sequence[int], block: int, rank: int, layer_indices: Iterable[int]) -> torch.Tensor:
        """The bytes block `block` of `tokens` holds on `rank` for the given layers, concatenated."""
        shape, bs = self.shape, self.shape.block_size
        parts = []
        for layer_index in layer_indices:
            values = [slot_value(tokens[p], p, self.owner(rank), layer_index) for p in range(block * bs, (block + 1) * bs)]
            slots = torch.tensor(values, dtype=torch.float32).reshape(1, bs, 1)
            parts.append(slots.expand(shape.kv_heads, bs, 2 * shape.head_dim).contiguous().view(torch.uint8).flatten())
        return torch.cat(parts)

    def group_layers(self, group: int) -> list[int]:
        """Layer indices of KV-cache group `group` (every layer with one group)."""
        return list(range(group, self.shape.layers, self.groups))

    def _store_keys(self, hashes: Sequence[bytes], block: int, rank: int) -> list[tuple[bytes, list[int]]]:
        """(key, layer indices) under which `rank` stores block `block` (of every group)."""
        key = hashes[block * self.per_block + (rank if self.per_block > 1 else 0)]
        if self.connector.variant != "cp" and not self.connector.is_mla and rank != 0:
            key = rank_key(key, rank)
        if self.layerwise:
            return [(layer_key(key, i), [i]) for i in range(self.shape.layers)]
        return [(group_key(key, group), self.group_layers(group)) for group in range(self.groups)]

    def _expect_blocks_of(self, tokens: Sequence[int]) -> None:
        hashes = prefix_block_hashes(tokens, self.shape.block_size, self.per_block)
        for block in range(len(tokens) // self.shape.block_size):
            for rank in range(self.world_size):
                for key, layer_indices in self._store_keys(hashes, block, rank):
                    if key not in self.expected_rows:
                        self.expected_rows[key] = self.block_rows(tokens, block, rank, layer_indices)

    def wrap(self, keys: Sequence[bytes], payload: BlockPayload) -> BlockPayload:
        return RecordingPayload(payload, tuple(keys), self)

    def check_stored(self, keys: Sequence[bytes], rows: torch.Tensor) -> None:
        for key, row in zip(keys, rows):
            expected = self.expected_rows.get(key)
            if expected is None:
                self.violations.append(f"StoredBytes (Python-only): a dump stored unexpected key {key.hex()[:12]}")
            elif not torch.equal(row, expected):
                self.violations.append(
                    f"StoredBytes (Python-only): key {key.hex()[:12]} stored bytes that differ from its block "
                    "(the block was rewritten while its dump read it)"
                )

    def check_loads(
        self, rank: int, meta: DeferDumpMetadata, errors: set[int], requests: dict[str, SimRequest],
        kv_caches: dict[str, torch.Tensor],
    ) -> None:
        """Loaded blocks hold exactly the stored prefix (blocks with a load error are the scheduler's)."""
        names = list(kv_caches)
        for req_id, dispatch in meta.request_meta.items():
            if not dispatch.load_block_ids or req_id not in requests:
                continue
            tokens = requests[req_id].tokens
            tables = (dispatch.load_block_ids, *dispatch.load_group_block_ids)  # the load range starts at block 0
            for group, table in enumerate(tables):
                layers = self.group_layers(group)
                for block, block_id in enumerate(table):
                    if block_id in errors or (group > 0 and block_id == NULL_BLOCK):  # out of the window: not loaded
                        continue
                    expected = self.block_rows(tokens, block, rank, layers)
                    actual = torch.cat([kv_caches[names[i]][block_id].contiguous().view(torch.uint8).flatten() for i in layers])
                    if not torch.equal(actual, expected):
                        self.violations.append(
                            f"LoadedBytes (Python-only): rank {rank} block {block_id} of {req_id} differs from the store"
                        )
