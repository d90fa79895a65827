"""`durably runs export RUN_ID [-o FILE]`: a run's history as its versioned JSON document
(`Engine.export_history`), printed or written to FILE, for `durably.testing.Replayer` to
replay against new code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from durably._cli.common import (
    EXIT_OK,
    AppOpt,
    Args,
    CliError,
    StoreOpt,
    dispatch,
    echo,
    on_control_engine,
    print_json,
)
from durably._core.errors import RunNotFoundError
from durably._engine.engine import Engine

__all__ = ["register"]


def register(runs: typer.Typer) -> None:
    @runs.command(
        "export",
        short_help="a run's history as JSON, to replay against new code",
        help=(
            "Print the run's history (the run and every checkpoint, in seq order) as a "
            "versioned JSON document, or write it to --output FILE. A saved history replays "
            "against new code with durably.testing.Replayer, which fails when the code no "
            "longer follows it."
        ),
    )
    def _export_cmd(
        run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
        output: Annotated[
            Path | None,
            typer.Option("--output", "-o", metavar="FILE", help="write the history to FILE"),
        ] = None,
        store: StoreOpt = None,
        app: AppOpt = None,
    ) -> None:
        dispatch(on_control_engine(_export), run_id=run_id, output=output, store=store, app=app)


async def _export(engine: Engine, args: Args) -> int:
    try:
        history = await engine.export_history(args.run_id)
    except RunNotFoundError as exc:
        raise CliError(str(exc)) from None
    if args.output is None:
        print_json(history)
        return EXIT_OK
    _write(args.output, history)
    echo(
        f"Run {args.run_id}'s history ({len(history['checkpoints'])} checkpoints, "
        f"{history['run']['status']}) written to {args.output}."
    )
    return EXIT_OK


def _write(path: Path, history: dict[str, Any]) -> None:
    # The command's only work after the read: nothing else waits on this loop.
    try:
        path.write_text(json.dumps(history, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from None
