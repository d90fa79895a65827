"""`durably start APP WORKFLOW --input JSON [--run-id ID] [--wait] [--json]`."""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from durably._cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    compact_json,
    echo,
    load_app,
    parse_json_arg,
    print_json,
    replica_of,
)
from durably._core.errors import (
    InputValidationError,
    InvalidRunIdError,
    RunIdConflictError,
    WorkflowNotFoundError,
)
from durably._core.ids import given_run_id
from durably._core.models import WorkflowRun
from durably._engine.engine import Engine


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "start",
        help="start a run of WORKFLOW (optionally wait for its result)",
        description=(
            "Start a run. Without --wait the run is only enqueued (a `durably worker` sharing "
            "the store executes it) and its id is printed. With --wait the command waits for "
            "the result; when APP's engine drives runs (the default), it executes the run in "
            "this process — which then works as a worker of the store until the run finishes "
            "(it may also pick up other pending runs; they are drained safely on exit)."
        ),
    )
    p.add_argument("app", metavar="APP", help="module:attribute naming a durably.Engine")
    p.add_argument("workflow", metavar="WORKFLOW", help="registered workflow name")
    p.add_argument(
        "--input",
        metavar="JSON",
        help="the input as JSON (`@file` reads a file, `-` stdin); default null",
    )
    p.add_argument("--run-id", metavar="ID", help="run id (idempotent: an existing run is kept)")
    p.add_argument("--workflow-version", metavar="V", help="pin a registered version")
    p.add_argument("--tag", action="append", metavar="TAG", help="tag the run (repeatable)")
    p.add_argument("--wait", action="store_true", help="wait for the run to finish")
    p.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="with --wait: give up after SECONDS"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    value = parse_json_arg(args.input, "--input")  # before importing APP: fail fast
    try:
        given_run_id(args.run_id)
    except InvalidRunIdError as exc:
        raise CliError(f"--run-id: {exc}", EXIT_USAGE) from None
    app = load_app(args.app)
    return asyncio.run(_start(app, args, value))


async def _start(app: Engine, args: argparse.Namespace, value: Any) -> int:
    # Without --wait, or when APP's engine does not drive, a drive=False replica only enqueues:
    # a short-lived CLI process must not begin executing a run it is about to abandon.
    in_process = args.wait and app.drive_runs
    engine = app if in_process else replica_of(app)
    try:
        async with engine:
            try:
                handle = await engine.start(
                    args.workflow,
                    value,
                    run_id=args.run_id,
                    tags=args.tag,
                    version=args.workflow_version,
                )
            except InputValidationError as exc:
                raise CliError(str(exc), EXIT_USAGE) from None
            except (WorkflowNotFoundError, RunIdConflictError) as exc:
                known = sorted({wf.name for wf in app.registered_workflows()})
                hint = f" (registered: {', '.join(known)})" if known else ""
                raise CliError(f"{exc}{hint}") from None
            if not args.wait:
                run = await engine.get_run(handle.run_id)
                if args.json:
                    print_json(run.to_json() if run else {"id": handle.run_id})
                else:
                    echo(handle.run_id)
                return EXIT_OK
            try:
                run = await engine.wait_for_run(
                    handle.run_id, timeout=args.timeout, until="terminal"
                )
            except TimeoutError:
                raise CliError(
                    f"run {handle.run_id} did not finish within {args.timeout:g}s; it goes on "
                    f"(see `durably runs show {handle.run_id}`)"
                ) from None
            return _report(run, args.json)
    finally:
        if engine is not app:
            await app.close()  # never opened: closes the store it owns


def _report(run: WorkflowRun, as_json: bool) -> int:
    if as_json:
        print_json(run.to_json())
    elif run.status == "completed":
        echo(compact_json(run.output))
    else:
        message = run.error.message if run.error else run.status
        code = f" [{run.error.code}]" if run.error and run.error.code else ""
        raise CliError(f"run {run.id} {run.status}: {message}{code}")
    return EXIT_OK if run.status == "completed" else EXIT_FAILED
