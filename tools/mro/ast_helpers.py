"""Small questions about Python syntax that the reader (source.py) and its fact modules (block_tables.py,
task_holders.py) all ask: is this ``self``, what names does a target bind, what does a loop iterate and run, which
``self`` container does an expression reach, which locals derive from given ones. Kept apart so that the fact
modules, which source.py imports, need not import source.py."""
from __future__ import annotations

import ast
from typing import Callable, Iterable, Iterator

#: Calls on a ``self`` container that hand back one of its entries (or a view of them).
ENTRY_CALLS = frozenset({"get", "setdefault", "pop", "values", "items", "__getitem__"})

#: Builtins that wrap what they are given without changing which object it comes from (``list(self.x)``).
_WRAPPERS = frozenset({"list", "enumerate", "sorted", "tuple"})


def is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def called_name(call: ast.Call) -> str | None:
    """The name a call is made by: ``f(...)`` -> ``f``, ``x.f(...)`` -> ``f``; None for any other callee."""
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def target_names(target: ast.AST) -> set[str]:
    """The names an assignment target rebinds (``x``, ``a, *b``), not those it only reads (``d[x] = …``)."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(target_names(e) for e in target.elts))
    if isinstance(target, ast.Starred):
        return target_names(target.value)
    return set()


def loop_bodies(nodes: Iterable[ast.AST]) -> Iterator[tuple[ast.expr, list[ast.AST]]]:
    """(what is iterated, what runs per entry) for each ``for`` loop and comprehension generator among ``nodes``."""
    for node in nodes:
        if isinstance(node, (ast.For, ast.AsyncFor)):
            yield node.iter, [*node.body, *node.orelse]
        elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            element: list[ast.AST] = [node.elt] if not isinstance(node, ast.DictComp) else [node.key, node.value]
            for generator in node.generators:
                yield generator.iter, [*element, *generator.ifs]


def names_in(node: ast.AST) -> set[str]:
    """Every name an expression (or statement) mentions, at any depth."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def self_call(node: ast.AST) -> str | None:
    """``self.<m>(...)`` -> ``m``."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_self(node.func.value):
        return node.func.attr
    return None


def self_container(node: ast.AST) -> str | None:
    """The ``self`` attribute an expression reaches, as the container itself or one of its entries: ``self.x``,
    ``self.x[k]``, ``self.x.get(k)`` (``setdefault``, ``pop``, ``values()``, ``items()``), possibly wrapped in
    ``list(...)``/``enumerate(...)``/``sorted(...)``/``tuple(...)`` -> ``x``."""
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _WRAPPERS and node.args:
            node = node.args[0]
        elif isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ENTRY_CALLS:
            node = node.func.value
        else:
            break
    if isinstance(node, ast.Attribute) and is_self(node.value):
        return node.attr
    return None


def derived_names(bindings: list[tuple[set[str], ast.AST]], seeds: set[str],
                  reads: Callable[[ast.AST, set[str]], bool]) -> set[str]:
    """``seeds`` and every name bound (each binding: the names, the value) from a value that ``reads`` says holds
    something of the names found so far, until nothing more is found."""
    derived = set(seeds)
    grew = True
    while grew:
        grew = False
        for names, value in bindings:
            if names - derived and reads(value, derived):
                derived |= names
                grew = True
    return derived


def attribute_reads(nodes: Iterable[ast.AST], attr: str) -> tuple[tuple[int, bool], ...]:
    """(line, is it only measured) for each read of ``<x>.<attr>`` (or ``getattr(x, "<attr>", ...)``) among ``nodes``:
    measured when the read (possibly ``x.attr or ()``) is the argument of ``len(...)``, so none of its entries is used."""
    nodes = list(nodes)
    parents = {child: node for node in nodes for child in ast.iter_child_nodes(node)}
    found: list[tuple[int, bool]] = []
    for node in nodes:
        read = (isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.ctx, ast.Load)) or (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == attr)
        if not read:
            continue
        child, up = node, parents.get(node)
        while isinstance(up, ast.BoolOp):
            child, up = up, parents.get(up)
        measured = isinstance(up, ast.Call) and isinstance(up.func, ast.Name) and up.func.id == "len" \
            and up.args == [child]
        found.append((node.lineno, measured))
    return tuple(found)
