"""The `deferdump` command line. Each command lives in its own module and registers itself here."""
from __future__ import annotations

import typer

app = typer.Typer(
    name="deferdump",
    help="Model-check, trace and replay the deferred KV-dump protocol (UCM PR #989).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root() -> None:
    """deferdump: is a KV block ever freed and rewritten while an async dump still reads it?"""


@app.command("version")
def version() -> None:
    """Print deferdump's version."""
    from importlib.metadata import version as _v

    typer.echo(_v("deferdump"))


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
