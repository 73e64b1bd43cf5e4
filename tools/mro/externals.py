"""Classes a connector file names but does not define: vLLM's connector base, ``SupportsHMA``, ``ABC``.

Their behaviour is vLLM's documented defaults (``request_finished`` -> ``(False, None)``, ``get_finished`` ->
``(None, None)``, ``handle_preemptions`` a no-op, the seven abstract methods abstract). Any other imported
base is *opaque*: it may define connector methods the analysis cannot see, so judgments through it are
``unknown``.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from deferdump.tools.mro.source import CONNECTOR_METHODS, BodyKind, ClassFacts, MethodFacts

ROOT_CONNECTOR = "KVConnectorBase_V1"
HMA_MIXIN = "SupportsHMA"

#: The methods vLLM's base declares abstract: a class defining all of them is a connector by duck typing.
ABSTRACT_CONNECTOR_METHODS = frozenset(
    {
        "start_load_kv",
        "wait_for_layer_load",
        "save_kv_layer",
        "wait_for_save",
        "get_num_new_matched_tokens",
        "update_state_after_alloc",
        "build_connector_meta",
    }
)
#: Connector methods only a connector defines (a helper may have a ``shutdown`` or ``register_kv_caches`` too): a
#: class defining one is a connector whatever its bases.
CONNECTOR_SIGNS = frozenset(CONNECTOR_METHODS) - {"shutdown", "register_kv_caches"}
_CONSTANTS = {"request_finished": "(False, None)", "get_finished": "(None, None)"}
_NOOPS = frozenset({"handle_preemptions", "register_kv_caches", "shutdown", "update_connector_output"})
_SELF_CALLS = {"get_transfer_results": frozenset({"get_finished"})}

#: vLLM's metadata base classes: ``ABC`` subclasses with no connector methods.
VLLM_ABC_EXTERNALS: frozenset[str] = frozenset({"KVConnectorMetadata", "KVConnectorWorkerMetadata"})

#: Classes whose ancestry is known to add no connector behaviour.
BENIGN_EXTERNALS: frozenset[str] = frozenset({"object", "ABC", "Generic", "Protocol"})


def _base_method(owner: str, name: str) -> MethodFacts:
    body: BodyKind = "abstract" if name in ABSTRACT_CONNECTOR_METHODS else "noop" if name in _NOOPS else "code"
    return MethodFacts(
        name=name,
        owner=owner,
        lineno=0,
        body=body,
        self_calls=_SELF_CALLS.get(name, frozenset()),
        constant_return=_CONSTANTS.get(name),
    )


def _external(name: str, bases: tuple[str, ...], methods: dict[str, MethodFacts], opaque: tuple[str, ...] = ()) -> ClassFacts:
    return ClassFacts(
        name=name,
        file="<external>",
        lineno=0,
        bases=bases,
        base_exprs=bases,
        methods=methods,
        external=True,
        opaque=opaque,
    )


#: A base named as a connector (``ExampleConnector``, ``LMCacheConnectorV1``), not ``KVConnectorStats``.
CONNECTOR_NAME = re.compile(r"Connector(V\d+|_V\d+)?$")


def connector_like(methods: Iterable[str], bases: Iterable[str]) -> bool:
    """A class that defines a connector method, or names a base ``…Connector``: a connector, read or not."""
    return bool(set(methods) & CONNECTOR_SIGNS) or any(CONNECTOR_NAME.search(base) for base in bases)


def unread_connector_base(name: str) -> ClassFacts:
    """An imported base of a connector-like class, not analysed: it derives from vLLM's base as far as the reader
    knows, and may define any connector method (so every judgment through it is ``unknown``)."""
    return _external(name, (ROOT_CONNECTOR,), {}, opaque=(
        f"{name} is imported, not analysed, and its subclass defines connector methods (or names it a connector): "
        "it may be a connector and define any connector method",))


def known_external(name: str) -> ClassFacts:
    """The stand-in for a class the analysed files name but do not define."""
    if name == "object":
        return _external("object", (), {})
    if name in BENIGN_EXTERNALS:
        return _external(name, ("object",), {})
    if name in VLLM_ABC_EXTERNALS:
        return _external(name, ("ABC",), {})
    if name == ROOT_CONNECTOR:
        methods = {m: _base_method(name, m) for m in CONNECTOR_METHODS if m != "request_finished_all_groups"}
        return _external(name, ("ABC",), methods)
    if name == HMA_MIXIN:
        abstract = MethodFacts(name="request_finished_all_groups", owner=name, lineno=0, body="abstract")
        return _external(name, ("ABC",), {"request_finished_all_groups": abstract})
    return _external(
        name, ("object",), {}, opaque=(f"{name} is imported, not analysed: it may define connector methods",)
    )
