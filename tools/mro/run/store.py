"""The recording store: stands in for a connector's store client and records which blocks each task reads.

A task submitted with ``dump``/``dump_data`` reads the block ids in its first argument (an int, or lists and
tuples of ints nested per KV-cache group; 0 is vLLM's null block and reads nothing). Only ids vLLM handed the
class (:class:`BlockId`, kept through lists, slices, dicts and pickling) count as blocks of the KV cache: an int
the class made itself (a staging slot, an offset, ``int(b)``) may name memory the forward never writes, so a
dump of one is outside what a replay can judge and raises :class:`StoreCallUnmodelled`.

A task runs until the connector waits it (``wait``/``wait_dump``) or the replay completes it (the model's ``task_complete``): the
slowest store, which every real store may be. ``check`` says whether it is done. Every other store call is
outside what the replay can judge and raises :class:`StoreCallUnmodelled`, so a run never guesses.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from deferdump.reference.errors import DeferDumpError

NULL_BLOCK = 0

__all__ = ["NULL_BLOCK", "BlockId", "RecordingStore", "StoreCallUnmodelled", "StoreTask", "store_factory"]


class StoreCallUnmodelled(DeferDumpError):
    """The connector called a store method the recording store does not model."""


class BlockId(int):
    """A KV-cache block id as the replay hands it to the class (block tables, ``update_state_after_alloc``,
    ``request_finished``). Its type is its provenance: arithmetic and ``int()`` give plain ints, which the store
    does not take for KV blocks (the explorer once called ``StagingCopyConnector`` unsafe because its dumps of
    host staging slots 1, 2 … were read as KV blocks 1, 2 …)."""

    __slots__ = ()


@dataclass
class StoreTask:
    """One dump task: its order of submission, the blocks it reads, and whether it is still running."""

    ordinal: int
    blocks: frozenset[int]
    submitter: str
    running: bool = True
    rank: int = 0  # the worker that submitted it: its blocks are that rank's copy of the KV cache
    waited_by: str | None = None

    def __hash__(self) -> int:
        return self.ordinal


def _block_ids(value: object) -> Iterable[int]:
    if isinstance(value, bool):
        raise StoreCallUnmodelled(f"a dump's blocks must be block ids, not {value!r}")
    if isinstance(value, int):
        if value != NULL_BLOCK and not isinstance(value, BlockId):
            raise StoreCallUnmodelled(
                f"a dump names {value}, an int the class computed rather than a block id vLLM handed it (a staging "
                "slot or an offset reads memory the replay does not model)")
        yield value
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _block_ids(item)
    else:
        raise StoreCallUnmodelled(f"a dump's blocks must be block ids (ints, nested per group), not "
                                  f"{type(value).__name__}")


@dataclass
class RecordingStore:
    """The store every stubbed store module hands out in one replay (one store, shared by every role and rank;
    each task remembers its rank, whose KV-cache copy it reads)."""

    tasks: list[StoreTask] = field(default_factory=list)
    current_caller: str = "?"
    current_rank: int = 0

    # -- the store API -------------------------------------------------------------------------------------
    def dump(self, block_ids: object, *args: object, **kwargs: object) -> StoreTask:
        blocks = frozenset(b for b in _block_ids(block_ids) if b != NULL_BLOCK)
        task = StoreTask(len(self.tasks) + 1, blocks, self.current_caller, rank=self.current_rank)
        self.tasks.append(task)
        return task

    dump_data = dump

    def wait(self, task: object) -> int:
        own = self._own(task)
        if own.running:
            own.running = False
            own.waited_by = self.current_caller
        return 0

    wait_dump = wait

    def check(self, task: object) -> bool:
        return not self._own(task).running

    def lookup(self, keys: object, *args: object, **kwargs: object) -> list[bool]:
        """Nothing is stored for a load: every key misses (the replay drives no loads)."""
        return [False] * len(keys) if hasattr(keys, "__len__") else []  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        raise StoreCallUnmodelled(f"the connector called store.{name}, which the recording store does not "
                                  "model (it models dump/dump_data, wait/wait_dump, check and lookup)")

    # -- the replay's side ---------------------------------------------------------------------------------
    def _own(self, task: object) -> StoreTask:
        if isinstance(task, StoreTask) and task in self.tasks:
            return task
        raise StoreCallUnmodelled(f"the connector waited or checked {task!r}, not a task this store returned")

    def running_readers(self, block: int, rank: int = 0) -> list[StoreTask]:
        """The running tasks of ``rank`` that read ``block`` (of that rank's KV cache)."""
        return [t for t in self.tasks if t.running and t.rank == rank and block in t.blocks]

    def running(self) -> list[StoreTask]:
        return [t for t in self.tasks if t.running]

    def complete(self, ordinal: int, rank: int = 0) -> bool:
        """The store finishes the ``ordinal``-th task (1-based) ``rank`` submitted; False when there is none."""
        own = [t for t in self.tasks if t.rank == rank]
        if 1 <= ordinal <= len(own):
            own[ordinal - 1].running = False
            return True
        return False


def store_factory(store: RecordingStore):  # type: ignore[no-untyped-def]
    """A callable for any factory name a stubbed store module is asked for: it returns ``store``."""
    def factory(*args: object, **kwargs: object) -> RecordingStore:
        return store
    return factory
