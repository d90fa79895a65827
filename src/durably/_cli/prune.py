"""`durably runs prune --status S [--status S2] --older-than DURATION [--keep N] [--dry-run]
[--yes]`: delete finished runs by a retention policy, once.

The policy is `durably.RetentionPolicy(statuses, max_age=--older-than, max_count=--keep)`;
only terminal statuses are accepted. The command counts what would go first (a dry run) and,
unless `--dry-run`, asks before deleting (on stderr, read from stdin) unless `--yes`. Deleting
goes in bounded batches (`prune`), each one transaction, so runs being driven meanwhile are
never blocked for long; a finished parent whose child is still live is kept.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

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
from durably._core.retention import PruneResult, RetentionPolicy
from durably._engine.engine import Engine

__all__ = ["register"]


def register(runs: typer.Typer) -> None:
    @runs.command(
        "prune",
        short_help="delete finished runs older than a duration / beyond a count",
        help=(
            "Delete finished runs of the given statuses (completed, failed, cancelled, dead) "
            "that finished longer ago than --older-than (e.g. 30d, 12h, 90m) and/or are not "
            "among the --keep most recent, with their checkpoints and rows. A finished parent "
            "whose child is still live is kept. --dry-run only counts; otherwise asks first "
            "unless --yes."
        ),
    )
    def _prune_cmd(
        status: Annotated[
            list[str],
            typer.Option("--status", help="a terminal status to prune (repeatable)"),
        ],
        older_than: Annotated[
            str | None,
            typer.Option("--older-than", metavar="DURATION", help="e.g. 30d, 12h, 90m"),
        ] = None,
        keep: Annotated[
            int | None,
            typer.Option("--keep", metavar="N", help="keep the N most recent runs"),
        ] = None,
        dry_run: Annotated[
            bool, typer.Option("--dry-run", help="count what would go; delete nothing")
        ] = False,
        yes: Annotated[
            bool, typer.Option("-y", "--yes", help="do not ask for confirmation")
        ] = False,
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
    ) -> None:
        dispatch(
            on_control_engine(_prune),
            status=status,
            older_than=older_than,
            keep=keep,
            dry_run=dry_run,
            yes=yes,
            store=store,
            app=app,
            json=json,
        )


def _policy(args: Args) -> RetentionPolicy:
    try:
        return RetentionPolicy(args.status, max_age=args.older_than, max_count=args.keep)
    except ValueError as exc:
        message = str(exc).removeprefix("RetentionPolicy: ")
        raise CliError(
            f"{message} (durably runs prune --status S --older-than DURATION [--keep N])"
        ) from exc


def _report(result: PruneResult) -> dict[str, Any]:
    return {"count": result.count, "runIds": result.run_ids, "dryRun": result.dry_run}


async def _prune(engine: Engine, args: Args) -> int:
    policy = _policy(args)
    would = await engine.prune(policy, dry_run=True)
    if args.dry_run or would.count == 0:
        if args.json:
            print_json(_report(would))
        else:
            echo(f"{would.count} run(s) would be deleted.")
            for run_id in would.run_ids:
                echo(f"  {run_id}")
        return EXIT_OK
    if not args.yes and not confirm(f"Delete {would.count} finished run(s) for good?"):
        echo("Nothing deleted.", sys.stderr)
        return EXIT_FAILED
    done = await engine.prune(policy)
    if args.json:
        print_json(_report(done))
    else:
        echo(f"{done.count} run(s) deleted.")
    return EXIT_OK
