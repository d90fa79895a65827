"""`durably runs delete RUN_ID [--yes] [--force]`: remove a run and its children for good.

Deleting erases the run's record, its checkpoints and its child runs (`delete_run`); nothing
can bring them back, so the command asks first (on stderr, read from stdin) unless `--yes`.
A run that has not settled is refused: a worker may be executing it right now, and removing
it under that worker loses the work silently. `--force` deletes it anyway, cancelling it
first (with its children) so that the workers holding it stop instead of writing on.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from durably._cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    AppOpt,
    Args,
    CliError,
    JsonOpt,
    StoreOpt,
    confirm,
    dispatch,
    echo,
    on_control_engine,
    print_json,
)
from durably._engine.engine import Engine

__all__ = ["register"]


def register(runs: typer.Typer) -> None:
    @runs.command(
        "delete",
        short_help="delete a settled run and its children (asks first unless --yes)",
        help=(
            "Delete the run, its checkpoints and its child runs for good. Asks for "
            "confirmation unless --yes. A run that has not settled (pending, running, "
            "suspended, …) is refused unless --force, which cancels it first and then "
            "deletes it."
        ),
    )
    def _delete_cmd(
        run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
        yes: Annotated[
            bool, typer.Option("-y", "--yes", help="do not ask for confirmation")
        ] = False,
        force: Annotated[
            bool,
            typer.Option(
                "--force", help="also delete a run that has not settled (cancels it first)"
            ),
        ] = False,
    ) -> None:
        dispatch(
            on_control_engine(_delete),
            run_id=run_id,
            store=store,
            app=app,
            json=json,
            yes=yes,
            force=force,
        )


async def _delete(engine: Engine, args: Args) -> int:
    run = await engine.get_run(args.run_id)
    if run is None:
        raise CliError(f"Run {args.run_id} not found.")
    if not run.is_terminal and not args.force:
        raise CliError(
            f"Run {run.id} is {run.status}, not settled: a worker may be executing it. Cancel "
            f"it first (durably runs cancel {run.id}) or pass --force to cancel and delete it."
        )
    if not args.yes:
        children = len(await engine.get_run_children(run.id))
        also = f" and its {children} child run(s)" if children else ""
        question = f"Delete run {run.id} ({run.workflow}, {run.status}){also} for good?"
        if not confirm(question):
            echo(f"Run {run.id} kept.", sys.stderr)
            return EXIT_FAILED
    if not run.is_terminal:
        await engine.cancel(run.id)
    deleted = await engine.delete_run(run.id)
    if args.json:
        print_json({"runId": run.id, "deleted": deleted, "status": run.status})
    else:
        echo(f"Run {run.id} deleted ({deleted} run(s) with its children).")
    return EXIT_OK
