"""The reading rules the third blind round called for, without TLC: transfers started outside the model's save
path, drains through a local, method aliases in a class body, literal finish answers, decorators, and a save
that submits in one function and waits in another. Each names the blind class that was judged wrongly
without it (tests/fixtures/mro/corpus/blind_*.py; the corpus test judges them with TLC)."""
from __future__ import annotations

import textwrap

from deferdump.tools.mro.behaviour import UNKNOWN, EffectReader
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.judge import Judge, ModelRunner
from deferdump.tools.mro.source import read_source
from deferdump.tools.mro.tla import ModelBounds

HEADER = "import functools\nfrom vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1\n"


def _hierarchy(source: str):
    return build_hierarchy(read_source(HEADER + textwrap.dedent(source), "<t>"))


def _label(source: str, cls: str, method: str):
    hierarchy = _hierarchy(source)
    owner = hierarchy.lookup(cls, method)
    assert owner is not None
    return EffectReader(hierarchy).label(cls, owner, method)


def _outside(source: str, cls: str) -> tuple[str, ...]:
    return Judge(_hierarchy(source), ModelRunner(ModelBounds(), 60))._transfers_outside_the_model(cls, None)


def test_a_pool_submit_or_store_dump_in_start_load_kv_is_a_transfer_the_model_does_not_follow() -> None:
    for body in ("self._pool.submit(self._push, meta.plan)", "self.store.dump(meta.blocks)",
                 "self._helper(meta)"):
        source = f"""
        class C(KVConnectorBase_V1):
            def _helper(self, meta):
                self._pool.submit(self._push, meta.plan)
            def start_load_kv(self, forward_context, **kw):
                meta = self._get_connector_metadata()
                {body}
        """
        why = _outside(source, "C")
        assert len(why) == 1 and "C.start_load_kv may start a transfer" in why[0], (body, why)


def test_a_dump_started_in_handle_preemptions_or_get_finished_is_one_too() -> None:
    """The model's handle_preemptions and get_finished only wait: a save of the preempted or finished
    request's blocks started there (they are freed right after a preemption) is outside every model run."""
    for method, args in (("handle_preemptions", "self, metadata"), ("get_finished", "self, finished_req_ids")):
        source = f"""
        class C(KVConnectorBase_V1):
            def {method}({args}):
                self._spill.append(self.store.dump(self._blocks_of_preempted()))
        """
        why = _outside(source, "C")
        assert len(why) == 1 and f"C.{method} may start a transfer" in why[0], (method, why)


def test_a_load_copied_with_non_blocking_on_the_current_stream_is_not_one_but_on_a_side_stream_it_is() -> None:
    current = """
    class C(KVConnectorBase_V1):
        def start_load_kv(self, forward_context, **kw):
            for layer, host in self._loads():
                layer.copy_(host.to(layer.device, non_blocking=True))
    """
    assert _outside(current, "C") == ()
    side = current.replace("            for layer", "            with torch.cuda.stream(self._side):\n"
                           "                pass\n            for layer")
    assert len(_outside(side, "C")) == 1


def test_a_drain_through_a_local_pairs_with_the_layer_save_as_a_synchronous_save() -> None:
    source = """
    class C(KVConnectorBase_V1):
        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kw):
            self._step_tasks.append(self.store.dump(self._get_connector_metadata().blocks))
        def wait_for_save(self):
            tasks, self._step_tasks = self._step_tasks, []
            for task in tasks:
                try:
                    self.store.wait(task)
                except RuntimeError:
                    pass
    """
    assert _label(source, "C", "save_kv_layer").label == "sync_save"
    assert _label(source, "C", "wait_for_save").label == "base"
    # the same pair keeping request records for later reports (WriteBackManifestConnector): not a plain sync
    recording = source.replace("self._step_tasks.append(", "self._saved.add('r')\n"
                               "            self._step_tasks.append(")
    assert _label(recording, "C", "save_kv_layer").label == "submit_layer"
    wait = _label(recording, "C", "wait_for_save")
    assert wait.label == UNKNOWN and "request records" in wait.reasons[0]


def test_a_method_alias_binds_the_body_defined_above_not_a_subclass_override() -> None:
    source = """
    class Base(KVConnectorBase_V1):
        def _finish(self, request, block_ids):
            if request.request_id not in self._async_dump_req_ids:
                return False, None
            return False, {"key": request.request_id}
        request_finished = _finish
    class Child(Base):
        def _finish(self, request, block_ids):
            return True, None
    """
    assert _label(source, "Child", "request_finished").label == "base"  # Base._finish: never delays
    rebound = source.replace("        request_finished = _finish", "        request_finished = _finish\n"
                             "        _finish = staticmethod(print)")
    assert _label(rebound, "Base", "request_finished").label == "base"  # bound before the rebinding
    opaque = source.replace("request_finished = _finish", "request_finished = functools.partialmethod(_finish)")
    assert _label(opaque, "Child", "request_finished").label == UNKNOWN


def test_a_finish_whose_every_answer_is_the_same_literal_is_labelled_by_it() -> None:
    for first, label in (("True", "delay_all"), ("False", "base")):
        source = f"""
        class C(KVConnectorBase_V1):
            def request_finished(self, request, block_ids):
                if request.request_id in self._async_dump_req_ids:
                    return {first}, {{"key": 1}}
                return {first}, None
        """
        assert _label(source, "C", "request_finished").label == label


def test_decorators_are_read_when_their_wrapper_calls_the_body_once_else_unknown() -> None:
    template = """
    def timed(name):
        def decorate(fn):
            @functools.wraps(fn)
            def wrapper(self, *args, **kwargs):
                try:
                    return fn(self, *args, **kwargs)
                finally:
                    self._timings[name] += 1
            return wrapper
        return decorate
    def retry(fn):
        @functools.wraps(fn)
        def wrapper(self, *args, **kwargs):
            for _ in range(2):
                try:
                    return fn(self, *args, **kwargs)
                except RuntimeError:
                    pass
        return wrapper
    def sometimes(fn):
        def wrapper(self, *args, **kwargs):
            return fn(self, *args, **kwargs) if self._enabled else None
        return wrapper
    def later(fn):
        def wrapper(self, *args, **kwargs):
            self._pool.submit(fn, self, *args, **kwargs)
        return wrapper
    class C(KVConnectorBase_V1):
        @DECORATOR
        def wait_for_save(self):
            task = self.store.dump(self._get_connector_metadata().blocks)
            self.store.wait(task)
    """
    assert _label(template.replace("DECORATOR", 'timed("w")'), "C", "wait_for_save").label == "sync_save"
    for decorator in ("retry", "sometimes", "later", "imported_elsewhere"):
        label = _label(template.replace("DECORATOR", decorator), "C", "wait_for_save")
        assert label.label == UNKNOWN and f"@{decorator} wraps the body" in label.reasons[0], decorator


def test_a_save_that_submits_here_and_waits_in_another_function_is_unknown_not_a_layer_task() -> None:
    source = """
    class C(KVConnectorBase_V1):
        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kw):
            for req in self._get_connector_metadata().requests:
                self._persist(req)
        def _persist(self, req):
            self._inflight[req.req_id] = self.store.dump(req.block_ids)
            self._settle(req.req_id)
        def _settle(self, req_id):
            task = self._inflight.pop(req_id, None)
            if task is not None:
                self.store.wait(task)
    """
    label = _label(source, "C", "save_kv_layer")
    assert label.label == UNKNOWN and "waits store tasks in another function" in label.reasons[0]


def test_a_function_defined_inside_a_method_is_not_the_methods_own_work() -> None:
    """``flush`` runs whenever someone calls it, not in save_kv_layer: the dump outlives the call, so the save is
    no synchronous one. Whether ``flush`` runs before the block is reused is not followed (the reader follows no
    callable, fourteenth blind round): ``unknown``, not the deferred ``submit_layer`` it was read as before."""
    source = """
    class C(KVConnectorBase_V1):
        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kw):
            def flush():
                self.store.wait(self._last)
            self._last = self.store.dump(self._get_connector_metadata().blocks)
            self._flushers.append(flush)
    """
    label = _label(source, "C", "save_kv_layer")
    assert label.label == UNKNOWN, label
    assert any("store wait() inside nested function flush()" in r for r in label.reasons), label.reasons


def test_a_task_kept_one_per_key_is_worse_than_its_label_unless_the_key_is_fresh_or_a_waited_layer() -> None:
    """The second blind round's DeferredSlotStore keeps ``self._inflight[req_id] = dump(...)`` once per layer:
    with two layers the first task is replaced and never waited, which no model label expresses (the model
    keeps every task). The label stays (an overwrite it leads to is real) and says the code does worse."""
    keyed = """
    class C(KVConnectorBase_V1):
        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kw):
            for req in self._get_connector_metadata().requests:
                self._inflight[req.req_id] = self.store.dump(req.block_ids)
    """
    label = _label(keyed, "C", "save_kv_layer")
    assert label.label == "submit_layer" and label.beyond_model
    assert "self._inflight[req] = task" in label.beyond_model[0]
    fresh = keyed.replace("self._inflight[req.req_id]", "self._inflight[next(self._ids)]")
    assert not _label(fresh, "C", "save_kv_layer").beyond_model
    per_layer_waited = """
    class C(KVConnectorBase_V1):
        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kw):
            self._tasks[layer_name] = self.store.dump(self._get_connector_metadata().blocks)
        def wait_for_save(self):
            for task in self._tasks.values():
                self.store.wait(task)
            self._tasks.clear()
    """
    paired = _label(per_layer_waited, "C", "save_kv_layer")
    assert paired.label == "sync_save" and not paired.beyond_model
    per_layer_kept = per_layer_waited.replace(
        "for task in self._tasks.values():\n                self.store.wait(task)\n            self._tasks.clear()",
        "pass")
    assert _label(per_layer_kept, "C", "save_kv_layer").beyond_model  # kept across steps: a later step replaces it
    fresh_local = keyed.replace("self._inflight[req.req_id] = self.store.dump(req.block_ids)",
                                "key = next(self._ids)\n                self._inflight[key] = self.store.dump(req.block_ids)")
    assert not _label(fresh_local, "C", "save_kv_layer").beyond_model


def test_a_single_attribute_holding_the_last_task_loses_the_others_unless_waited_in_the_call() -> None:
    """``self._last = dump(...)`` per layer keeps only the last layer's task; a task also waited in the same
    call loses nothing when the next one takes its place (the label itself is other rules' business)."""
    last = """
    class C(KVConnectorBase_V1):
        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kw):
            self._last = self.store.dump(self._get_connector_metadata().blocks)
        def wait_for_save(self):
            self.store.wait(self._last)
    """
    assert _label(last, "C", "save_kv_layer").beyond_model
    waited_here = """
    class C(KVConnectorBase_V1):
        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kw):
            task = self.store.dump(self._get_connector_metadata().blocks)
            self._last = task
            self.store.wait(task)
    """
    assert not _label(waited_here, "C", "save_kv_layer").beyond_model
    grown = last.replace("self._last = self.store.dump(self._get_connector_metadata().blocks)",
                         "self._last = self._last + [self.store.dump(self._get_connector_metadata().blocks)]")
    assert not _label(grown, "C", "save_kv_layer").beyond_model
