"""Reading connector facts from source with `ast`: bases, delegations, tracking, forwards, inner classes."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from deferdump.tools.mro.errors import DuplicateClassError, NoConnectorError, SourceParseError
from deferdump.tools.mro.hierarchy import build_hierarchy
from deferdump.tools.mro.source import Delegation, Forward, read_files, read_source
from support import FIXTURES as ALL_FIXTURES

FIXTURES = ALL_FIXTURES / "mro"


def _read(text: str, **kwargs: str) -> dict:
    return read_source(textwrap.dedent(text), "<test>", **kwargs)


def test_bases_keep_order_and_use_simple_names_of_attribute_bases() -> None:
    classes = _read(
        """
        from vllm import base
        class A(base.KVConnectorBase_V1, SupportsHMA, Generic[T], metaclass=ABCMeta):
            pass
        """
    )
    assert classes["A"].bases == ("KVConnectorBase_V1", "SupportsHMA", "Generic")
    assert classes["A"].base_exprs == ("base.KVConnectorBase_V1", "SupportsHMA", "Generic[T]")


def test_super_forms_and_explicit_parent_call_are_delegations() -> None:
    method = _read(
        """
        class C(B):
            def wait_for_save(self):
                super().wait_for_save()
                super(B, self).wait_for_save()
                A.wait_for_save(self)
                torch.cat(x)
        """
    )["C"].methods["wait_for_save"]
    assert method.delegations == (
        Delegation("super", "wait_for_save", "C"),
        Delegation("super", "wait_for_save", "B"),
        Delegation("explicit", "wait_for_save", "A"),
    )


def test_dynamic_super_is_reported_as_opaque() -> None:
    method = _read(
        """
        class C(B):
            def get_finished(self, ids):
                return super(type(self), self).get_finished(ids)
        """
    )["C"].methods["get_finished"]
    assert method.delegations == ()
    assert "dynamic class" in method.opaque[0]


def test_tracking_operations_are_classified() -> None:
    methods = _read(
        """
        class C(B):
            def a(self, r):
                self._async_dump_req_ids.add(r)
            def b(self, r):
                if r in self._async_dump_req_ids:
                    self._async_dump_req_ids.discard(r)
            def c(self, ids):
                self._async_dump_req_ids -= ids
                self._async_dump_req_ids |= ids
            def d(self):
                self._async_dump_req_ids = set()
            def e(self, r):
                tracked = self._async_dump_req_ids
                tracked.update(r)
            def f(self):
                self.other.add(1)
        """
    )["C"].methods
    assert methods["a"].tracking_ops == {"add"}
    assert methods["b"].tracking_ops == {"read", "remove"}
    assert methods["c"].tracking_ops == {"add", "remove"}
    assert methods["d"].tracking_ops == {"assign"}
    assert "add" in methods["e"].tracking_ops
    assert methods["f"].tracking_ops == frozenset()


def test_tracking_attribute_is_configurable() -> None:
    method = _read(
        """
        class C(B):
            def build_connector_meta(self, out):
                self._saving.add(1)
        """,
        tracking_attr="_saving",
    )["C"].methods["build_connector_meta"]
    assert method.tracking_ops == {"add"}


def test_forwards_self_calls_and_constant_returns() -> None:
    methods = _read(
        """
        class W(KVConnectorBase_V1):
            def request_finished(self, request, block_ids):
                inner = self.connector
                return inner.request_finished(request, block_ids)
            def get_finished(self, ids):
                self._helper()
                return self.connector.get_finished(ids)
            def other(self, request, block_ids):
                '''doc'''
                if request:
                    return False, None
                return (False, None)
            def handle_preemptions(self, meta):
                pass
            def wait_for_save(self):
                raise NotImplementedError("abstract")
        """
    )["W"].methods
    assert methods["request_finished"].forwards == (Forward("connector", "request_finished"),)
    assert methods["get_finished"].forwards == (Forward("connector", "get_finished"),)
    assert methods["get_finished"].self_calls == {"_helper"}
    assert methods["other"].constant_return == "(False, None)"
    assert methods["request_finished"].constant_return is None
    assert methods["handle_preemptions"].body == "noop"
    assert methods["wait_for_save"].body == "abstract"


def test_init_inner_classes_cover_every_branch_and_local_aliases() -> None:
    facts = _read(
        """
        class W(KVConnectorBase_V1):
            def __init__(self, cfg):
                cls = A if cfg.a else B
                if cfg.c:
                    self.connector = C(cfg)
                elif cfg.d:
                    self.connector = mod.D(cfg)
                else:
                    self.connector = cls(cfg)
                self.store = make_store(cfg)
                self._async_dump_req_ids = set()
        """
    )["W"]
    assert facts.inner_classes["connector"] == ("C", "D", "A", "B")
    assert "_async_dump_req_ids" not in facts.inner_classes


def test_classes_under_module_level_blocks_are_found_and_nested_ones_ignored() -> None:
    classes = _read(
        """
        try:
            class A(KVConnectorBase_V1):
                class Inner:
                    pass
        except ImportError:
            pass
        if True:
            class B(A):
                pass
        """
    )
    assert set(classes) == {"A", "B"}


def test_syntax_error_is_a_precise_error() -> None:
    with pytest.raises(SourceParseError, match=r"syntax_error.py:\d+: syntax error"):
        read_files([FIXTURES / "syntax_error.py"])


def test_unreadable_file_is_a_precise_error(tmp_path: Path) -> None:
    with pytest.raises(SourceParseError, match="cannot read"):
        read_files([tmp_path / "missing.py"])


def test_duplicate_class_across_files_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("class A(KVConnectorBase_V1):\n    pass\n")
    (tmp_path / "b.py").write_text("class A(KVConnectorBase_V1):\n    def save_kv_layer(self, *a):\n        pass\n")
    (tmp_path / "c.py").write_text("class A(KVConnectorMetadata):\n    pass\n")
    for other in ("b.py", "c.py"):
        with pytest.raises(DuplicateClassError, match="class A is defined in both"):
            read_files([tmp_path / "a.py", tmp_path / other])


def test_a_class_repeated_word_for_word_in_several_files_is_read_once(tmp_path: Path) -> None:
    """Dynamo's KVBM connector defines the same ``DynamoConnectorMetadata`` in its connector, leader and
    worker modules: the same code, so one class (positions and comments may differ)."""
    meta = "class Meta(KVConnectorMetadata):\n    def __init__(self, metadata: bytes):\n        self.metadata = metadata\n"
    (tmp_path / "connector.py").write_text(meta + "class C(KVConnectorBase_V1):\n    pass\n")
    (tmp_path / "leader.py").write_text("# the leader half\n\n\n" + meta.replace("self.metadata =", "self.metadata  ="))
    classes = read_files([tmp_path / "connector.py", tmp_path / "leader.py"])
    assert classes["Meta"].file == str(tmp_path / "connector.py") and "C" in classes
    (tmp_path / "worker.py").write_text(meta.replace("bytes", "str"))
    with pytest.raises(DuplicateClassError, match="class Meta is defined in both .*connector.py and .*worker.py"):
        read_files([tmp_path / "connector.py", tmp_path / "leader.py", tmp_path / "worker.py"])


def test_file_without_connectors_is_an_error() -> None:
    with pytest.raises(NoConnectorError, match="no connector classes"):
        build_hierarchy(read_files([FIXTURES / "no_connectors.py"]), sources=[str(FIXTURES / "no_connectors.py")])


def test_ucm_shaped_cp_resolves_build_connector_meta_to_direct() -> None:
    hierarchy = build_hierarchy(read_files([FIXTURES / "ucm_shaped.py"]))
    assert hierarchy.mro["UCMCPConnector"][:4] == [
        "UCMCPConnector",
        "UCMLayerWiseConnector",
        "UCMDirectConnector",
        "KVConnectorBase_V1",
    ]
    assert hierarchy.resolves("UCMCPConnector")["build_connector_meta"] == "UCMDirectConnector"
    assert "PendingDumpTask" not in hierarchy.connectors
    assert hierarchy.supports_hma("UCMConnector") and not hierarchy.supports_hma("UCMCPConnector")


def test_tracking_attr_option_changes_what_counts_as_tracking() -> None:
    from deferdump.tools.mro.behaviour import EffectReader

    source = textwrap.dedent(
        """
        class Saver(KVConnectorBase_V1):
            def build_connector_meta(self, out):
                self._note(out)
                return out
            def _note(self, out):
                self._saving_ids.update(out.dumping)
        """
    )
    # with the default attribute nothing in Saver is visibly asynchronous (no tracking set, no store
    # submit), so "tracks nothing" is not known to be a fault: unknown rather than notrack
    for attr, expected in (("_saving_ids", "track"), ("_async_dump_req_ids", "unknown")):
        hierarchy = build_hierarchy(read_source(source, "<test>", tracking_attr=attr))
        assert EffectReader(hierarchy).label("Saver", "Saver", "build_connector_meta").label == expected


def test_files_are_analysed_together(tmp_path: Path) -> None:
    (tmp_path / "base.py").write_text(
        "class Direct(KVConnectorBase_V1):\n    def build_connector_meta(self, out):\n        return out\n"
    )
    (tmp_path / "cp.py").write_text("from base import Direct\n\n\nclass CP(Direct):\n    pass\n")
    hierarchy = build_hierarchy(read_files([tmp_path / "base.py", tmp_path / "cp.py"]))
    assert hierarchy.mro["CP"] == ["CP", "Direct", "KVConnectorBase_V1", "ABC", "object"]
    assert hierarchy.resolves("CP")["build_connector_meta"] == "Direct"
    assert hierarchy.classes["CP"].file.endswith("cp.py")
