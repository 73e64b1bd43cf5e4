"""Block keys: chained prefix hashes of full token blocks, and the per-rank / per-layer / per-CP-rank keys.

A block's hash covers its tokens *and* every block before it (chained, like UCM's MD5 `request_hasher`),
so a store hit on hash i implies the whole prefix up to block i matches. Ranks that hold different KV
shards (TP ranks) and per-layer dumps need distinct store keys; they are derived from the block hash.
"""
from __future__ import annotations

import array
import hashlib
from collections.abc import Sequence

_SEED = hashlib.md5(b"deferdump-prefix-v1").digest()


def _derive(parent: bytes, tag: bytes, index: int) -> bytes:
    return hashlib.md5(parent + tag + index.to_bytes(8, "little")).digest()


def prefix_block_hashes(token_ids: Sequence[int], block_size: int, hashes_per_block: int = 1) -> list[bytes]:
    """Chained hashes of every *full* block of `token_ids`; `hashes_per_block` > 1 for context parallelism.

    With context parallelism each block gets `hashes_per_block` sub-keys, one per CP rank, laid out
    interleaved (`[b0r0, b0r1, ..., b1r0, ...]`) so that rank r's keys are `hashes[r::cp_world_size]`.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    hashes: list[bytes] = []
    parent = _SEED
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = array.array("q", token_ids[start : start + block_size]).tobytes()
        parent = hashlib.md5(parent + block).digest()
        if hashes_per_block == 1:
            hashes.append(parent)
        else:
            hashes.extend(_derive(parent, b"cp", rank) for rank in range(hashes_per_block))
    return hashes


def rank_key(block_hash: bytes, rank: int) -> bytes:
    """The key rank `rank` stores its shard of a block under (rank 0 keeps the plain hash)."""
    return block_hash if rank == 0 else _derive(block_hash, b"rank", rank)


def layer_key(block_hash: bytes, layer_index: int) -> bytes:
    """The key of one layer's slice of a block, for layer-wise dumps and loads."""
    return _derive(block_hash, b"layer", layer_index)
