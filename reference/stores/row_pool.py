"""A pool of reused host rows, one per stored block, that devices gather dumps straight into.

Why a pool: a store that allocates a fresh row per dumped block pays a page fault per 4 KiB the first time
each row is written (≈3x a copy into touched memory), and a second copy when it clones the device's
payload. The pool's rows live in chunks that are allocated once and never freed while the pool lives, so
after warm-up every dump is written into touched memory, once. UCM's pinned buffer pool and vLLM's CPU
offload blocks make the same choice.

Memory bound: a chunk is as large as the request that created it, and a row returns to the free list as
soon as its block is dropped, so the pool holds at most the peak number of rows in use at once (stored
blocks plus rows staged for dumps in flight), never rows kept alive by an unrelated row of their chunk.
Rows of different widths (whole blocks, single layers) come from separate chunks.

Adjacent free rows are handed out together, so a staging is usually one or a few 2-D segments and the
device gathers each with one `index_select` per layer.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from deferdump.reference.stores.base import StagedRows

_Slot = tuple[int, int]  # (chunk index, row within the chunk), per row width


class RowPool:
    """Fixed-width uint8 rows in never-freed chunks; rows are staged, kept (stored) or free."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chunks: dict[int, list[torch.Tensor]] = {}  # row width -> chunks [rows, width]
        self._bases: dict[int, list[int]] = {}  # row width -> data_ptr of each chunk's row 0
        self._free: dict[int, set[_Slot]] = {}  # row width -> free slots
        self._where: dict[int, tuple[int, _Slot]] = {}  # data_ptr of every row -> (width, slot)
        self._staged: set[int] = set()  # data_ptrs of rows handed to a staging and not yet kept or released
        self._kept: set[int] = set()  # data_ptrs of rows a store keeps

    # ----------------------------------------------------------------- rows
    def _take(self, count: int, width: int) -> list[_Slot]:
        """`count` free slots of `width`, lowest first (a new chunk for the shortfall); lock held."""
        free = self._free.setdefault(width, set())
        slots = sorted(free)[:count]
        free.difference_update(slots)
        missing = count - len(slots)
        if missing:
            chunks = self._chunks.setdefault(width, [])
            # Never an inference tensor (vLLM dumps inside torch.inference_mode()): a copy thread outside
            # inference mode writes these rows.
            with torch.inference_mode(False):
                chunk = torch.empty((missing, width), dtype=torch.uint8)
            chunks.append(chunk)
            self._bases.setdefault(width, []).append(chunk.data_ptr())
            index = len(chunks) - 1
            for row in range(missing):
                self._where[self._address(width, (index, row))] = (width, (index, row))
            slots.extend((index, row) for row in range(missing))
        return slots

    def _address(self, width: int, slot: _Slot) -> int:
        """The data_ptr of a slot's row, without making a view: chunks are contiguous uint8 [rows, width]."""
        return self._bases[width][slot[0]] + slot[1] * width

    def _view(self, width: int, slot: _Slot, rows: int = 1) -> torch.Tensor:
        chunk_index, row = slot
        return self._chunks[width][chunk_index][row : row + rows]

    def stage(self, count: int, width: int) -> StagedRows:
        """`count` rows for a device to gather into, as runs of adjacent rows.

        Only bookkeeping happens here (the caller is the forward's thread): the rows' tensor views are made
        where they are first used, on the device's copy thread (`StagedRows.deferred`)."""
        if count < 1 or width < 1:
            raise ValueError(f"staging needs a positive row count and width, got {count} x {width}")
        with self._lock:
            slots = self._take(count, width)
            chunks = self._chunks[width]
            bases = self._bases[width]
            (first_chunk, first_row), (last_chunk, last_row) = slots[0], slots[-1]
            addresses: Sequence[int]
            if first_chunk == last_chunk and last_row - first_row == count - 1:
                # One run (the usual case: evicted blocks were stored together): the slots are sorted and
                # distinct, so the same chunk at both ends and a span of `count` rows mean adjacent rows.
                runs = [(chunks[first_chunk], first_row, count)]
                start = bases[first_chunk] + first_row * width
                addresses = range(start, start + count * width, width)
            else:
                runs = _runs(slots, chunks)
                addresses = [bases[chunk] + row * width for chunk, row in slots]
            self._staged.update(addresses)
        return StagedRows.deferred(count, width, lambda: _segments(runs), lambda _staged: self._release_staged(addresses))

    def keep(self, row: torch.Tensor) -> torch.Tensor:
        """The pool row a store keeps for `row`: `row` itself when it is a staged row of this pool (no
        copy), else a free row that `row` is copied into."""
        address = row.data_ptr()
        with self._lock:
            found = self._where.get(address)
            if (found is not None and address in self._staged and row.dim() == 1 and row.numel() == found[0]
                    and row.dtype == torch.uint8 and row.is_contiguous()):  # exactly the staged row: kept as it is
                self._staged.discard(address)
                self._kept.add(address)
                return row
            slot = self._take(1, row.numel())[0]
            kept = self._view(row.numel(), slot)[0]
            self._kept.add(kept.data_ptr())
        kept.copy_(row)
        return kept

    def give_back(self, row: torch.Tensor) -> None:
        """A kept row is free again (its block was dropped); nothing may read it after."""
        address = row.data_ptr()
        with self._lock:
            if address not in self._kept:
                raise ValueError("give_back of a row this pool does not keep")
            self._kept.discard(address)
            width, slot = self._where[address]
            self._free[width].add(slot)

    def _release_staged(self, addresses: Sequence[int]) -> None:
        """Free the rows of one staging (by their data_ptrs) that no store kept."""
        with self._lock:
            for address in addresses:
                if address in self._staged:
                    self._staged.discard(address)
                    width, slot = self._where[address]
                    self._free[width].add(slot)

    # ---------------------------------------------------------------- audit
    def counts(self) -> tuple[int, int, int]:
        """(rows staged, rows kept, rows free): the leak checks compare kept rows with stored blocks."""
        with self._lock:
            return len(self._staged), len(self._kept), sum(len(free) for free in self._free.values())

    def nbytes(self) -> int:
        """Bytes of every chunk (the pool's resident memory)."""
        with self._lock:
            return sum(chunk.numel() for chunks in self._chunks.values() for chunk in chunks)


def _runs(slots: list[_Slot], chunks: list[torch.Tensor]) -> list[tuple[torch.Tensor, int, int]]:
    """(chunk, first row, rows) per run of adjacent slots, in order."""
    runs: list[tuple[torch.Tensor, int, int]] = []
    start, count = 0, len(slots)
    for position in range(1, count + 1):
        if position == count or slots[position] != (slots[position - 1][0], slots[position - 1][1] + 1):
            chunk_index, row = slots[start]
            runs.append((chunks[chunk_index], row, position - start))
            start = position
    return runs


def _segments(runs: list[tuple[torch.Tensor, int, int]]) -> list[torch.Tensor]:
    """The views of a staging's runs. Never inference tensors (vLLM dumps inside torch.inference_mode()):
    a copy thread outside inference mode writes these rows."""
    with torch.inference_mode(False):
        return [chunk[row : row + rows] for chunk, row, rows in runs]
