"""Find the source files of the base classes a connector imports (vLLM's shipped connectors, a package's own base
connector), so a subclass is read with its parents instead of through a name the reader cannot see into.

Nothing is imported: a module is located the way Python's import system would find it (the file's own folder,
then the given roots, then where the running Python finds the top-level package, ``importlib.util.find_spec`` of
that top-level name only, which runs no package code) and parsed. Only bases are followed: of classes that look
like connectors (they define a connector method, or a base's name says ``Connector``) from anywhere, of other
classes only from vLLM or the file's own package, so a helper deriving from ``torch.nn.Module`` does not pull
torch's sources in. vLLM's own base (``KVConnectorBase_V1``,
``SupportsHMA``, the metadata bases) is never followed: the reader models it (externals.py).
"""
from __future__ import annotations

import ast
import importlib.util
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from deferdump.tools.mro.behaviour import BUILTIN_TYPES
from deferdump.tools.mro.externals import (BENIGN_EXTERNALS, HMA_MIXIN, ROOT_CONNECTOR, VLLM_ABC_EXTERNALS,
                                           connector_like)

log = logging.getLogger(__name__)

#: Names the reader models itself: following them would replace the model of vLLM's base by its code.
MODELLED = frozenset({ROOT_CONNECTOR, HMA_MIXIN, *VLLM_ABC_EXTERNALS, *BENIGN_EXTERNALS, *BUILTIN_TYPES})
#: Packages whose classes a connector's helpers derive from and whose bases are read for any class: vLLM's.
READ_PACKAGES = frozenset({"vllm"})
#: How many files following bases may add: a chain deeper than this is reported, not followed.
MAX_FOLLOWED = 24

__all__ = ["BaseSource", "MAX_FOLLOWED", "MODELLED", "imported_base_files"]


@dataclass(frozen=True)
class BaseSource:
    """A base class a connector imports, where its definition was found (``path`` None: not read, ``why`` says
    why)."""

    name: str  # the class's name in the module that defines it
    module: str  # the module it was imported from, as written (``.base`` for a relative import)
    importer: str  # the file whose class derives from it
    path: Path | None
    why: str = ""


@dataclass(frozen=True)
class _Import:
    module: str  # dotted, without leading dots
    level: int  # leading dots of a relative import
    name: str | None  # the imported name (``from m import name``); None for ``import m``


def _imports(tree: ast.Module) -> dict[str, _Import]:
    """Local name -> what it was imported as, for the module's top-level imports (also under ``if``/``try``)."""
    found: dict[str, _Import] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    found[alias.asname or alias.name] = _Import(node.module or "", node.level, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                found[local] = _Import(alias.name if alias.asname else alias.name.split(".")[0], 0, None)
    return found


def _classes(tree: ast.Module) -> Iterator[ast.ClassDef]:
    """Every class statement, nested ones included (a name defined anywhere in a file counts as defined there)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            yield node


def _looks_like_connector(node: ast.ClassDef) -> bool:
    own = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return connector_like(own, (ast.unparse(b) for b in node.bases))


def _own_package(path: Path) -> str | None:
    """The top-level package ``path`` is inside (the last folder up with an ``__init__.py``), if any."""
    top = None
    for folder in path.resolve().parents:
        if not (folder / "__init__.py").is_file():
            break
        top = folder.name
    return top


def _followed_for(node: ast.ClassDef, reference: "_Import", own_package: str | None) -> bool:
    """Bases of a connector are read wherever they come from; a helper's only from vLLM, from the file's own
    package or a relative import (its worker or scheduler half deriving from vLLM's), never from torch and the like."""
    top = reference.module.split(".")[0]
    return (_looks_like_connector(node) or reference.level > 0 or top in READ_PACKAGES
            or (own_package is not None and top == own_package))


def _base_reference(base: ast.expr, imports: dict[str, _Import]) -> tuple[_Import, str] | None:
    """The module a base expression names and the class's name there: ``X`` bound by ``from m import X``, or
    ``m.sub.X`` with ``m`` bound by ``import m``."""
    if isinstance(base, ast.Subscript):  # Generic[T]-style parameterised bases
        base = base.value
    if isinstance(base, ast.Name):
        bound = imports.get(base.id)
        if bound is not None and bound.name is not None:
            return bound, bound.name
        return None
    parts: list[str] = []
    node: ast.expr = base
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and parts:
        bound = imports.get(node.id)
        if bound is None:
            return None
        path = [*reversed(parts)]
        if bound.name is None:  # import m / import m as a
            return _Import(".".join([bound.module, *path[:-1]]).strip("."), 0, None), path[-1]
        return _Import(".".join([bound.module, bound.name, *path[:-1]]).strip("."), bound.level, None), path[-1]
    return None


def _package_roots(top: str) -> list[Path]:
    """Folders holding the top-level package or module ``top`` as the running Python finds it (no code runs)."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [Path(location).parent for location in spec.submodule_search_locations]
    if spec.origin and spec.origin.endswith(".py"):
        return [Path(spec.origin).parent]
    return []


def _module_file(reference: _Import, importer: Path, roots: Sequence[Path]) -> Path | None:
    parts = [p for p in reference.module.split(".") if p]
    if reference.level:
        base = importer.parent
        for _ in range(reference.level - 1):
            base = base.parent
        candidates = [base]
    else:
        if not parts:
            return None
        # the file's own folder (a script's), the roots, a folder above the file named as the package (the file is
        # inside that package's source tree), then the running Python's packages
        inside = [folder.parent for folder in importer.resolve().parents if folder.name == parts[0]]
        candidates = [importer.parent, *roots, *inside[:1], *_package_roots(parts[0])]
    for root in candidates:
        target = root.joinpath(*parts)
        for path in (target.with_suffix(".py") if parts else None, target / "__init__.py"):
            if path is not None and path.is_file():
                return path
    return None


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError) as error:
        log.info("%s: not read for bases (%s)", path, error)
        return None


def _definition(name: str, path: Path, roots: Sequence[Path], parse: Callable[[Path], ast.Module | None],
                hops: int = 4) -> tuple[Path, str] | None:
    """The file defining the class ``path`` defines or re-exports as ``name`` (``__init__.py`` re-exports), and
    the class's name there."""
    tree = parse(path)
    if tree is None:
        return None
    if any(node.name == name for node in _classes(tree)):
        return path, name
    bound = _imports(tree).get(name)
    if bound is None or bound.name is None or hops == 0:
        return None
    module = _module_file(bound, path, roots)
    return _definition(bound.name, module, roots, parse, hops - 1) if module is not None else None


def imported_base_files(paths: Sequence[Path], roots: Sequence[Path] = ()) -> tuple[list[Path], list[BaseSource]]:
    """The files to read besides ``paths`` for the bases their connector-like classes import (followed through
    the bases' own files), and every such base with where it was found. A file defining a class name that another
    read file defines too is not followed: which class a name means would then depend on imports the reader does
    not resolve, so the base stays unread and its subclasses ``unknown``."""
    given = {p.resolve() for p in paths}
    parsed: dict[Path, ast.Module | None] = {}

    def parse(path: Path) -> ast.Module | None:  # each file once: re-exports and bases meet the same files
        if path not in parsed:
            parsed[path] = _parse(path)
        return parsed[path]

    owner: dict[str, Path] = {}  # class name -> the read file defining it
    trees: dict[Path, ast.Module] = {}
    for path in paths:
        tree = parse(path)
        if tree is not None:
            trees[path] = tree
            owner.update({node.name: path for node in _classes(tree)})
    followed: list[Path] = []
    bases: list[BaseSource] = []
    pending: list[tuple[Path, ast.Module, set[str] | None]] = [(p, t, None) for p, t in trees.items()]
    queued: set[tuple[Path, str]] = set()  # (file, class) whose bases are followed

    def queue(path: Path, tree: ast.Module, name: str) -> None:
        if (path, name) not in queued:
            queued.add((path, name))
            pending.append((path, tree, {name}))

    while pending:
        path, tree, needed = pending.pop(0)
        imports = _imports(tree)
        local = {node.name for node in _classes(tree)}
        own_package = _own_package(path)
        for node in _classes(tree):
            if needed is not None and node.name not in needed:
                continue
            for base in node.bases:
                if needed is not None and isinstance(base, ast.Name) and base.id in local:
                    queue(path, tree, base.id)  # a base defined beside the followed class: its bases too
                    continue
                reference = _base_reference(base, imports)
                if reference is None:
                    continue
                bound, name = reference
                if name in MODELLED or name in owner or (needed is None and not _followed_for(node, bound, own_package)):
                    continue
                written = "." * bound.level + bound.module
                module = _module_file(bound, path, roots)
                definition = _definition(name, module, roots, parse) if module is not None else None
                if definition is None:
                    bases.append(BaseSource(name, written, str(path), None, f"no source file for {written or name} "
                                            "was found (pass its folder with --import-root)"))
                    continue
                found, defined_as = definition
                if defined_as != name:  # re-exported under another name: the reader knows classes by their names
                    bases.append(BaseSource(name, written, str(path), None, f"{found} defines it as {defined_as}"))
                    continue
                if found.resolve() in given:
                    continue
                found_tree = parse(found)
                clash = sorted(n for n in ({c.name for c in _classes(found_tree)} if found_tree else set())
                               if n in owner and owner[n] != found)
                if found_tree is None or clash or (found not in followed and len(followed) >= MAX_FOLLOWED):
                    why = (f"{found} cannot be parsed" if found_tree is None else
                           f"{found} defines {', '.join(clash[:3])}, also defined in {owner[clash[0]]}" if clash else
                           f"more than {MAX_FOLLOWED} files of bases")
                    log.warning("%s: base %s not read: %s", path, name, why)
                    bases.append(BaseSource(name, written, str(path), None, why))
                    continue
                bases.append(BaseSource(name, written, str(path), found))
                if found not in followed:
                    followed.append(found)
                    owner.update({c.name: found for c in _classes(found_tree)})
                queue(found, found_tree, name)
    return followed, bases
