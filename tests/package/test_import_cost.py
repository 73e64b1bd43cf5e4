"""Starting the CLI loads neither torch nor the connector: the test suite starts it about a hundred times,
and torch alone costs about 1.1 s of CPU per start (deferdump.reference imports its names on first use)."""
from __future__ import annotations

import subprocess
import sys


def _loaded_after(statement: str, *modules: str) -> list[str]:
    code = f"import sys\n{statement}\nprint(' '.join(m for m in {list(modules)!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.split()


def test_the_cli_and_the_error_classes_load_without_torch() -> None:
    heavy = ("torch", "deferdump.reference.connectors", "deferdump.reference.stores.base")
    assert _loaded_after("import deferdump.tools.cli.app", *heavy) == []
    assert _loaded_after("from deferdump.reference.errors import UserError", *heavy) == []


def test_the_package_names_still_resolve_on_first_use() -> None:
    assert _loaded_after("from deferdump.reference import DirectConnector, MemoryStore, UserError", "torch") == ["torch"]
    done = subprocess.run([sys.executable, "-c", "import deferdump.reference as r; r.NoSuchName"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "has no attribute 'NoSuchName'" in done.stderr


def test_type_checkers_see_every_lazily_exported_name() -> None:
    """The `TYPE_CHECKING` imports and the lazy table list the same names from the same modules: a name added
    to one only would be invisible to type checkers or missing at run time."""
    import ast
    from pathlib import Path

    import deferdump.reference as reference

    tree = ast.parse(Path(reference.__file__).read_text(encoding="utf-8"))
    guarded = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    seen = {(node.module, alias.name) for node in ast.walk(guarded) if isinstance(node, ast.ImportFrom)
            for alias in node.names}
    lazy = {(f"deferdump.reference.{module}", name) for module, names in reference._EXPORTS.items() for name in names}
    assert seen == lazy
