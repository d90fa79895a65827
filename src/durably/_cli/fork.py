"""`durably runs fork RUN_ID --from-seq N [--new-run-id ID] [--input JSON] [--wait]`.

Starts a new run that reuses the settled run's checkpoints before step N and executes from
there with the code the workers run now (`Engine.fork`); the original is not changed. The
command only writes the fork: a worker of the workflow executes it. `--wait` waits until the
fork is terminal and exits 1 unless it completed.
"""

from __future__ import annotations

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
    dispatch,
    echo,
    on_control_engine,
    parse_json_arg,
    print_json,
)
from durably._core.errors import (
    InputValidationError,
    RunIdConflictError,
    RunNotFoundError,
)
from durably._engine.defs.options import UNSET
from durably._engine.engine import Engine

__all__ = ["register"]


def register(runs: typer.Typer) -> None:
    @runs.command(
        "fork",
        short_help="start a new run reusing a settled run's steps before --from-seq",
        help=(
            "Start a NEW run of the run's workflow that reuses its checkpoints before step "
            "--from-seq (their results are not computed again) and executes from there with "
            "the code the workers run now. The original is not changed; the fork is tagged "
            "forked-from:RUN_ID@N and forked-from:RUN_ID. Only a completed, failed, cancelled "
            "or dead run is forked. The fork's id is --new-run-id, else RUN_ID~fork~N "
            "(forking again returns it)."
        ),
    )
    def _fork_cmd(
        run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
        from_seq: Annotated[
            int, typer.Option("--from-seq", metavar="N", help="the first step executed again")
        ],
        new_run_id: Annotated[
            str | None, typer.Option("--new-run-id", metavar="ID", help="the fork's run id")
        ] = None,
        input: Annotated[
            str | None,
            typer.Option(
                "--input",
                metavar="JSON",
                help="the fork's input (`@file` reads a file, `-` stdin); default the original's",
            ),
        ] = None,
        wait: Annotated[
            bool,
            typer.Option(
                "--wait", help="wait until the fork is terminal (exit 1 unless it completed)"
            ),
        ] = False,
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
    ) -> None:
        dispatch(
            on_control_engine(_fork),
            run_id=run_id,
            from_seq=from_seq,
            new_run_id=new_run_id,
            input=input,
            wait=wait,
            store=store,
            app=app,
            json=json,
        )


async def _fork(engine: Engine, args: Args) -> int:
    fork_input: Any = UNSET if args.input is None else parse_json_arg(args.input, "--input")
    try:
        handle = await engine.fork(
            args.run_id, from_seq=args.from_seq, new_run_id=args.new_run_id, input=fork_input
        )
    except (RunNotFoundError, RunIdConflictError, InputValidationError, ValueError) as exc:
        raise CliError(str(exc)) from None
    status = "pending"
    if args.wait:
        run = await engine.wait_for_run(handle.run_id, until="terminal")
        status = run.status
    if args.json:
        print_json(
            {
                "runId": handle.run_id,
                "forkedFrom": args.run_id,
                "fromSeq": args.from_seq,
                "status": status,
            }
        )
    else:
        echo(f"Run {args.run_id} forked from seq {args.from_seq} as {handle.run_id} ({status}).")
    return EXIT_OK if not args.wait or status == "completed" else EXIT_FAILED
