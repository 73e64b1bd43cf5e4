"""Random dump/release/check/wait/load/lookup sequences against a model dict, on every store kind.

The model says what a store must answer: blocks exist once their dump finished successfully; `check`
is True exactly once the transfer ended; a waited task is gone; a load returns the model's bytes or a
`LoadError` naming exactly the missing hashes; `stats().pending` counts un-waited tasks.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from deferdump.reference.stores.base import LoadError, StoreError, StoreTask, TaskNotFound
from support.stores import STORE_KINDS, StoreHarness, make_harness, settle

ALPHABET = [bytes([0xC0 + i]) * 8 for i in range(6)]
hash_lists = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=4)


def _content(block_hash: bytes) -> torch.Tensor:
    """Content-addressed bytes: the same hash always carries the same block."""
    return torch.full((24,), block_hash[0], dtype=torch.uint8) ^ torch.arange(24, dtype=torch.uint8)


def machine_for(kind: str) -> type[RuleBasedStateMachine]:
    class StoreModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.tmp = Path(tempfile.mkdtemp(prefix="deferdump-store-model-"))
            self.harness: StoreHarness = make_harness(kind, self.tmp)
            self.blocks: dict[bytes, torch.Tensor] = {}
            self.running: dict[int, tuple[StoreTask, bool]] = {}  # task id -> (task, fails)
            self.finished: dict[int, tuple[StoreTask, bool]] = {}
            self.waited: list[StoreTask] = []

        @property
        def store(self):
            return self.harness.store

        @rule(hashes=hash_lists, fails=st.booleans())
        def dump(self, hashes: list[bytes], fails: bool) -> None:
            task = self.harness.dump(hashes, torch.stack([_content(h) for h in hashes]), fail=fails)
            self.running[task.task_id] = (task, fails)

        @precondition(lambda self: self.running)
        @rule(data=st.data())
        def release(self, data: st.DataObject) -> None:
            task_id = data.draw(st.sampled_from(sorted(self.running)))
            task, fails = self.running.pop(task_id)
            self.harness.release(task)
            settle(self.store, task)
            self.finished[task_id] = (task, fails)
            if not fails:
                for block_hash in task.block_hashes:
                    self.blocks.setdefault(block_hash, _content(block_hash))

        @precondition(lambda self: self.running or self.finished)
        @rule(data=st.data())
        def check(self, data: st.DataObject) -> None:
            task_id = data.draw(st.sampled_from(sorted({**self.running, **self.finished})))
            task = (self.running.get(task_id) or self.finished[task_id])[0]
            assert self.store.check(task) is (task_id in self.finished)

        @precondition(lambda self: self.finished)
        @rule(data=st.data())
        def wait(self, data: st.DataObject) -> None:
            task_id = data.draw(st.sampled_from(sorted(self.finished)))
            task, fails = self.finished.pop(task_id)
            if fails:
                with pytest.raises(StoreError) as info:
                    self.store.wait(task)
                assert not isinstance(info.value, TaskNotFound)
            else:
                assert self.store.wait(task) is None
            self.waited.append(task)

        @precondition(lambda self: self.waited)
        @rule(data=st.data())
        def use_waited_task(self, data: st.DataObject) -> None:
            task = data.draw(st.sampled_from(self.waited))
            with pytest.raises(TaskNotFound):
                self.store.check(task)
            with pytest.raises(TaskNotFound):
                self.store.wait(task)

        @rule(hashes=hash_lists)
        def lookup(self, hashes: list[bytes]) -> None:
            expected = 0
            for block_hash in hashes:
                if block_hash not in self.blocks:
                    break
                expected += 1
            assert self.store.lookup_prefix(hashes) == expected

        @rule(hashes=st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=4, unique=True))
        def load(self, hashes: list[bytes]) -> None:
            missing = tuple(h for h in hashes if h not in self.blocks)
            if missing:
                with pytest.raises(LoadError) as info:
                    self.harness.load_now(hashes)
                assert info.value.bad_hashes == missing
            else:
                loaded = self.harness.load_now(hashes)
                assert loaded is not None and torch.equal(loaded, torch.stack([self.blocks[h] for h in hashes]))

        @invariant()
        def counters_match_model(self) -> None:
            stats = self.store.stats()
            assert stats.pending == len(self.running) + len(self.finished)
            assert stats.blocks == len(self.blocks)

        def teardown(self) -> None:
            for task, _ in self.running.values():
                self.harness.release(task)
            self.store.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    StoreModel.__name__ = f"StoreModel_{kind.replace('-', '_')}"
    return StoreModel


_SETTINGS = settings(max_examples=30, stateful_step_count=20, deadline=None)

for _kind in STORE_KINDS:
    _case = machine_for(_kind).TestCase
    _case.settings = _SETTINGS
    globals()[f"TestStoreModel_{_kind.replace('-', '_')}"] = _case
del _kind, _case  # only the named cases are collected
