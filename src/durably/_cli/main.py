"""`durably` console script: the typer application and its entry point.

Each command module declares its commands on the application (`register`) and keeps its
handler apart from the parsing (a handler takes an `Args` namespace and returns the exit
code). Usage errors (an unknown option, a bad number) are typer's own, exit 2; an
unknown command exits 1 (`CommandGroup`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Annotated

import typer

from durably._cli import dashboard, db, demo, runs, schedules, signals, start, watch, worker
from durably._cli.common import CAPTURE, EXIT_OK, EXIT_USAGE, Args, CommandGroup

EPILOG = (
    "Store URLs: sqlite:///path.db (default: $DURABLY_STORE, else sqlite:///durably.db) or "
    "postgresql://user@host/db."
)


def _version(value: bool) -> None:
    if value:
        from durably import __version__

        typer.echo(f"durably {__version__}")
        raise typer.Exit(EXIT_OK)


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="durably",
        help="Durable workflows for asyncio Python — command line.",
        epilog=EPILOG,
        add_completion=False,
        context_settings={"help_option_names": ["-h", "--help"]},
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
        cls=CommandGroup,
    )

    @app.callback(invoke_without_command=True)
    def _root(
        ctx: typer.Context,
        verbose: Annotated[
            int,
            typer.Option(
                "-v",
                "--verbose",
                count=True,
                show_default=False,
                help="log more (-v info, -vv debug)",
            ),
        ] = 0,
        version: Annotated[
            bool,
            typer.Option(
                "--version", callback=_version, is_eager=True, help="print the version and exit"
            ),
        ] = False,
    ) -> None:
        if ctx.invoked_subcommand is None:
            typer.echo(ctx.get_help())
            raise typer.Exit(EXIT_OK)
        level = logging.DEBUG if verbose >= 2 else logging.INFO if verbose else logging.WARNING
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    demo.register(app)
    worker.register(app)
    start.register(app)
    runs_group = runs.register(app)
    watch.register(runs_group)
    signals.register(app)
    schedules.register(app)
    db.register(app)
    dashboard.register(app)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; the process exit code."""
    command = typer.main.get_command(build_app())
    try:
        command.main(list(sys.argv[1:] if argv is None else argv), prog_name="durably")
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (EXIT_OK if code is None else 1)
    return EXIT_OK


def parse_args(argv: Sequence[str]) -> Args:
    """The `Args` the command `argv` names would be handed, without running it (for
    in-process checks of a command's option handling); a usage error raises `SystemExit`."""
    captured: list[Args] = []
    token = CAPTURE.set(captured.append)
    try:
        code = main(argv)
    finally:
        CAPTURE.reset(token)
    if not captured:
        raise SystemExit(code)
    return captured[0]


__all__ = ["EXIT_USAGE", "build_app", "main", "parse_args"]

if __name__ == "__main__":
    sys.exit(main())
