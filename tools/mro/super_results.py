"""Where an override hands vLLM something other than what its ``super()`` call returned: a field of the result
changed, the result rebound, mutated or replaced, or ``super()`` handed arguments other than the override's own. vLLM
acts on the return of these methods, so such an override decides itself; read as its base's (``super``) it passed
for the base's protocol (EagerBudgetConnector, AbortAwareGroupConnector, blind rounds'). Pure syntax."""
from __future__ import annotations

import ast
#: Methods whose return value vLLM acts on: an override that changes what ``super()`` returned decides it itself.
RETURNED_METHODS = frozenset({"build_connector_meta", "get_finished", "request_finished",
                              "request_finished_all_groups"})
_CHANGES = frozenset({"add", "discard", "remove", "update", "clear", "pop", "popitem", "append", "extend", "insert",
                      "sort", "reverse", "setdefault", "difference_update", "intersection_update",
                      "symmetric_difference_update", "appendleft", "popleft", "__ior__", "__isub__", "__iand__"})


def _super_call(node: ast.AST, method: str) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == method \
        and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Name) \
        and node.func.value.func.id == "super"


def _base_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def super_rewrites(func: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[tuple[int, str], ...]:
    """(line, what) wherever ``func`` (one of :data:`RETURNED_METHODS`) calls ``super().<its name>()`` and does not
    hand back exactly what that call returned: a field of the result reassigned or mutated (EagerBudgetConnector,
    thirtieth blind round: ``meta.dumps = ranked[:budget]`` after the base tracked every request it planned), the
    name rebound, or a return of something else. Empty where it makes no such call."""
    method = func.name
    if method not in RETURNED_METHODS:
        return ()
    nodes = [n for n in ast.walk(func)]
    calls = [n for n in nodes if _super_call(n, method)]
    if not calls:
        return ()
    parents = {child: node for node in nodes for child in ast.iter_child_nodes(node)}
    bound: dict[str, int] = {}
    shapes: list[tuple[str, ...]] = []
    found: list[tuple[int, str]] = []
    params = [a.arg for a in func.args.args[1:]]
    rebound = {t.id for n in nodes if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    for call in calls:
        given = [a.id if isinstance(a, ast.Name) else None for a in call.args]
        keyed = all(isinstance(k.value, ast.Name) and k.arg == k.value.id and k.arg in params for k in call.keywords)
        if given != params[:len(given)] or not keyed or set(params) & rebound:
            # AbortAwareGroupConnector (a blind round's) hands its base empty block tables for an aborted request,
            # so the base answers False for a request whose dump may still run
            found.append((call.lineno, f"calls `{ast.unparse(call)}` with arguments other than its own"))
        bind = parents.get(call)
        if isinstance(bind, ast.Return):
            continue
        if isinstance(bind, (ast.Assign, ast.AnnAssign)) and bind.value is call:
            targets = bind.targets if isinstance(bind, ast.Assign) else [bind.target]
            if len(targets) == 1 and isinstance(targets[0], ast.Name):
                bound[targets[0].id] = bind.lineno
                shapes.append((targets[0].id,))
                continue
            if len(targets) == 1 and isinstance(targets[0], ast.Tuple) \
                    and all(isinstance(e, ast.Name) for e in targets[0].elts):
                names = tuple(e.id for e in targets[0].elts)  # type: ignore[attr-defined]
                bound.update({n: bind.lineno for n in names})
                shapes.append(names)
                continue
        found.append((call.lineno, f"uses super().{method}()'s result other than by returning it"))
    for node in nodes:
        line = getattr(node, "lineno", func.lineno)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    name = _base_name(sub) if isinstance(sub, (ast.Attribute, ast.Subscript)) else \
                        (sub.id if isinstance(sub, ast.Name) else None)
                    if name in bound and not (getattr(node, "value", None) is not None
                                              and any(node.value is c for c in calls)):
                        found.append((line, f"changes `{ast.unparse(target)}`"))
                        break
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _CHANGES \
                and _base_name(node.func.value) in bound:
            found.append((line, f"calls `{ast.unparse(node.func)}()`"))
        elif isinstance(node, ast.Return) and bound:
            value = node.value
            if any(value is c for c in calls):
                continue
            names = (value.id,) if isinstance(value, ast.Name) else \
                tuple(e.id for e in value.elts) if isinstance(value, ast.Tuple) \
                and all(isinstance(e, ast.Name) for e in value.elts) else None  # type: ignore[attr-defined]
            if names not in shapes:
                found.append((line, f"returns `{ast.unparse(value) if value is not None else 'None'}`"))
    return tuple(dict.fromkeys(found))
