"""vLLM 0.32's GPU block pool as far as a connector pins blocks: the references a class takes and drops.

vLLM binds the scheduler's KV-cache manager to the connector once, after building both (scheduler.py ~358-360:
``connector.bind_kv_cache_manager(kv_cache_manager)``, which the base turns into ``bind_gpu_block_pool(
kv_cache_manager.block_pool)``, base.py ~474-489). A connector may then hold a block past its request's free with
``block_pool.touch(blocks)`` and let it go with ``block_pool.free_blocks(blocks)`` (block_pool.py ~752-806): a
block whose count stays above zero never returns to the free queue, so vLLM does not hand it to another request
(the fix of vllm#52360 and vLLM's offloading connectors work this way). The replay counts only the class's own
references: the request's reference is the engine's (a trace's allocation, the explorer's free list), so a
block the class pins may not be allocated while the pin lasts. Any other use of the pool (its free queue, the
prefix cache, a block's ``ref_cnt``) stops the run as :class:`~.stubs.StubMissing` rather than guessing.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["BlockPool", "KVCacheBlock", "KVCacheManager"]


class KVCacheBlock:
    """One block of the pool, as a class gets it from ``block_pool.blocks[i]``."""

    __slots__ = ("block_id", "_missing")

    def __init__(self, block_id: int, missing: Callable[[str], Exception]) -> None:
        self.block_id = block_id
        self._missing = missing

    @property
    def is_null(self) -> bool:
        return self.block_id == 0

    @property
    def block_hash(self) -> None:
        return None  # no prefix caching in a replay: no block is hashed

    @property
    def pool(self) -> None:
        return None  # the scheduler's own pool (block_pool.py ~788)

    @property
    def ref_cnt(self) -> int:
        raise self._missing("KVCacheBlock.ref_cnt (the replay counts only the class's own references)")

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id})"


class BlockPool:
    """The scheduler's GPU block pool: ``blocks`` by id, ``touch`` and ``free_blocks`` counted per block."""

    def __init__(self, num_blocks: int, missing: Callable[[str], Exception]) -> None:
        self._missing = missing
        self.num_gpu_blocks = num_blocks
        self.blocks = [KVCacheBlock(i, missing) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.pins: Counter[int] = Counter()  # the class's references per block id (touches less frees)
        self.log: list[str] = []  # what the class did, for the replay's list of calls

    def _ids(self, blocks: Iterable[Any], method: str) -> list[int]:
        ids = []
        for block in blocks:
            if not isinstance(block, KVCacheBlock):
                raise self._missing(f"BlockPool.{method} with {block!r}, not a block of the pool")
            ids.append(block.block_id)
        return ids

    def touch(self, blocks: Iterable[Any]) -> None:
        ids = [b for b in self._ids(blocks, "touch") if b != 0]
        self.pins.update(ids)
        self.log.append(f"touch {ids}")

    def free_blocks(self, ordered_blocks: Iterable[Any]) -> None:
        ids = [b for b in self._ids(ordered_blocks, "free_blocks") if b != 0]
        for block_id in ids:  # a free the class never took drops the request's own reference in vLLM: not
            self.pins[block_id] = max(0, self.pins[block_id] - 1)  # modelled, and no later pin is lost to it
        self.log.append(f"free_blocks {ids}")

    def pinned(self, block_id: int) -> bool:
        """Does the class hold a reference on ``block_id``?"""
        return self.pins[block_id] > 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._missing(f"BlockPool.{name}")


class KVCacheManager:
    """The scheduler's KV-cache manager, as a connector sees it: its block pool, and the block ids vLLM holds for a
    request (kv_cache_manager.py ~723-731: every group's, a finished request's too while its free is delayed)."""

    def __init__(self, block_pool: BlockPool, block_ids: Callable[[str], tuple[list[int], ...]]) -> None:
        self.block_pool = block_pool
        self._block_ids = block_ids

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self._block_ids(request_id)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self.block_pool._missing(f"KVCacheManager.{name}")  # noqa: SLF001
