"""The `deferdump` command line. Each command lives in its own module and registers itself here."""
from __future__ import annotations

import signal
import types

import typer

from deferdump.tools.cli.bench import bench
from deferdump.tools.cli.check import check
from deferdump.tools.cli.conformance import replay, traces, verify
from deferdump.tools.cli.explain import explain
from deferdump.tools.cli.mro import mro
from deferdump.tools.cli.soak import soak
from deferdump.tools.cli.validate import validate
from deferdump.tools.cli.watch import watch
from deferdump.reference.errors import UserError

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


app.command("check")(check)
app.command("traces")(traces)
app.command("replay")(replay)
app.command("verify")(verify)
app.command("explain")(explain)
app.command("bench")(bench)
app.command("soak")(soak)
app.command("mro")(mro)
app.command("validate")(validate)
app.command("watch")(watch)


def _terminated(signum: int, frame: types.FrameType | None) -> None:
    """SIGTERM (``timeout``, a CI runner, ``kill``) ends a command as Ctrl-C does. Python's default would end
    the process at once, without the cleanup that kills TLC's JVMs and vLLM's engines: they run in sessions of
    their own (so a terminal's Ctrl-C reaches only deferdump), and would be left running."""
    raise KeyboardInterrupt


def main() -> None:
    """Console-script entry point: usage errors and DeferdumpErrors become one line on stderr, no traceback."""
    signal.signal(signal.SIGTERM, _terminated)
    try:
        code = app(standalone_mode=False)
    except typer.TyperException as error:  # click's usage errors (typer vendors click)
        typer.echo(f"deferdump: {error.format_message()} (see deferdump --help)", err=True)
        raise SystemExit(error.exit_code) from None
    except typer.Abort:
        typer.echo("deferdump: aborted", err=True)
        raise SystemExit(1) from None
    except KeyboardInterrupt:  # a command without its own handler: its cleanup (finally blocks) has run
        typer.echo("deferdump: interrupted", err=True)
        raise SystemExit(130) from None
    except UserError as error:
        typer.echo(f"deferdump: {error}", err=True)
        raise SystemExit(2) from None
    raise SystemExit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
