"""`durably start APP WORKFLOW --input JSON [--run-id ID] [--wait] [--json]`."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Annotated, Any

import typer

from durably._cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Args,
    CliError,
    JsonOpt,
    compact_json,
    dispatch,
    echo,
    load_app,
    parse_json_arg,
    print_json,
    replica_of,
)
from durably._cli.progress import Progress
from durably._cli.runstate import snapshot_of
from durably._cli.watch import FANS_OVER, follow
from durably._core.errors import (
    InputValidationError,
    InvalidRunIdError,
    RunIdConflictError,
    WorkflowNotFoundError,
)
from durably._core.ids import given_run_id
from durably._core.models import WorkflowRun
from durably._engine.engine import Engine
from durably._engine.flow.quotas import check_existing_run


def register(app: typer.Typer) -> None:
    @app.command(
        "start",
        short_help="start a run of WORKFLOW (optionally wait for its result)",
        help=(
            "Start a run. Without --wait the run is only enqueued (a `durably worker` sharing "
            "the store executes it) and its id is printed. With --wait the command waits for "
            "the result; when APP's engine drives runs (the default), it executes the run in "
            "this process — which then works as a worker of the store until the run finishes "
            "(it may also pick up other pending runs; they are drained safely on exit). While "
            "it waits, its progress goes to stderr: a live status line on a terminal, plain "
            "lines otherwise (--quiet: none); stdout carries only the result."
        ),
    )
    def _start_cmd(
        app_spec: Annotated[
            str, typer.Argument(metavar="APP", help="module:attribute naming a durably.Engine")
        ],
        workflow: Annotated[
            str, typer.Argument(metavar="WORKFLOW", help="registered workflow name")
        ],
        input: Annotated[
            str | None,
            typer.Option(
                "--input",
                metavar="JSON",
                help="the input as JSON (`@file` reads a file, `-` stdin); default null",
            ),
        ] = None,
        run_id: Annotated[
            str | None,
            typer.Option(
                "--run-id",
                metavar="ID",
                help="run id (idempotent: an existing run of WORKFLOW is returned as it is; "
                "--input is then not needed, nor applied)",
            ),
        ] = None,
        workflow_version: Annotated[
            str | None,
            typer.Option("--workflow-version", metavar="V", help="pin a registered version"),
        ] = None,
        tag: Annotated[
            list[str] | None,
            typer.Option("--tag", metavar="TAG", help="tag the run (repeatable)"),
        ] = None,
        wait: Annotated[bool, typer.Option("--wait", help="wait for the run to finish")] = False,
        timeout: Annotated[
            float | None,
            typer.Option("--timeout", metavar="SECONDS", help="with --wait: give up after SECONDS"),
        ] = None,
        quiet: Annotated[
            bool, typer.Option("-q", "--quiet", help="with --wait: no progress on stderr")
        ] = False,
        json: JsonOpt = False,
    ) -> None:
        dispatch(
            run,
            app=app_spec,
            workflow=workflow,
            input=input,
            run_id=run_id,
            workflow_version=workflow_version,
            tag=tag or None,
            wait=wait,
            timeout=timeout,
            quiet=quiet,
            json=json,
        )


def run(args: Args) -> int:
    value = parse_json_arg(args.input, "--input")  # before importing APP: fail fast
    try:
        given_run_id(args.run_id)
    except InvalidRunIdError as exc:
        raise CliError(f"--run-id: {exc}", EXIT_USAGE) from None
    app = load_app(args.app)
    return asyncio.run(_start(app, args, value))


async def _start(app: Engine, args: Args, value: Any) -> int:
    # Without --wait, or when APP's engine does not drive, a drive=False replica only enqueues:
    # a short-lived CLI process must not begin executing a run it is about to abandon.
    in_process = args.wait and app.drive_runs
    engine = app if in_process else replica_of(app)
    # Listening before the start: the run's first events may fire before `start` returns.
    progress = Progress(sys.stderr) if in_process and not args.quiet else None
    unsubscribe = engine.subscribe(progress) if progress is not None else None
    try:
        async with engine:
            try:
                run_id = await _existing(engine, args) or await _enqueue(engine, args, value)
            except InputValidationError as exc:
                raise CliError(str(exc), EXIT_USAGE) from None
            except (WorkflowNotFoundError, RunIdConflictError) as exc:
                known = sorted({wf.name for wf in app.registered_workflows()})
                hint = f" (registered: {', '.join(known)})" if known else ""
                raise CliError(f"{exc}{hint}") from None
            if progress is not None:
                progress.follow(run_id)
            if not args.wait:
                run = await engine.get_run(run_id)
                if args.json:
                    print_json(run.to_json() if run else {"id": run_id})
                else:
                    echo(run_id)
                return EXIT_OK
            try:
                run = await _wait(engine, run_id, args, progress)
            except TimeoutError:
                raise CliError(
                    f"run {run_id} did not finish within {args.timeout:g}s; it goes on "
                    f"(see `durably runs show {run_id}`)"
                ) from None
            finally:
                if progress is not None:
                    progress.finish()
            return _report(run, args.json)
    finally:
        if unsubscribe is not None:
            unsubscribe()
        if progress is not None:
            progress.finish()
        if engine is not app:
            await app.close()  # never opened: closes the store it owns


async def _existing(engine: Engine, args: Args) -> str | None:
    """The id of the run `--run-id` already names, when it is this workflow's: a start with
    an existing run's id is idempotent, so it is that run, returned (or followed) as it is.

    Looked up before the input is checked: the engine validates the input first, and the
    input of a start that creates nothing does not matter, so re-running the command
    without its `--input` must not be refused for it. Decision: a DIFFERENT input given with
    an existing id is not applied either (as the engine's idempotent start does: the run
    keeps its stored input, tags and version); stderr says so, stdout stays the run's
    result. A run of
    another workflow (or namespace) holding the id is refused as `engine.start` refuses it.
    """
    if args.run_id is None:
        return None
    existing = await engine.get_run(args.run_id)
    if existing is None:
        return None
    check_existing_run(existing, name=args.workflow, namespace=engine.namespace or "default")
    given = [
        flag
        for flag, value in (
            ("--input", args.input),
            ("--tag", args.tag),
            ("--workflow-version", args.workflow_version),
        )
        if value is not None
    ]
    if given:
        echo(
            f"run {existing.id} already exists ({existing.status}): it is returned as it is; "
            f"{'/'.join(given)} not applied (the run keeps what it was started with)",
            sys.stderr,
        )
    return existing.id


async def _enqueue(engine: Engine, args: Args, value: Any) -> str:
    handle = await engine.start(
        args.workflow, value, run_id=args.run_id, tags=args.tag, version=args.workflow_version
    )
    return handle.run_id


async def _wait(engine: Engine, run_id: str, args: Args, progress: Progress | None) -> WorkflowRun:
    """The terminal run; meanwhile its progress on stderr (stdout stays the result alone):
    fed by this process's engine events when it executes the run, else read from the
    store."""
    if progress is not None:
        ticker = asyncio.create_task(_tick(engine, run_id, progress))
        try:
            return await engine.wait_for_run(run_id, timeout=args.timeout, until="terminal")
        finally:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
    existing = await engine.get_run(run_id)
    if args.quiet or (existing is not None and existing.is_terminal):
        return await engine.wait_for_run(run_id, timeout=args.timeout, until="terminal")
    return await follow(engine, run_id, sys.stderr, timeout=args.timeout)


# How often a terminal's live display reads the run's fans from the store (their totals are
# not in the events: a fan's members start as concurrency allows).
FANS_READ_S = 0.5


async def _tick(engine: Engine, run_id: str, progress: Progress) -> None:
    """Redraw the live display while waiting; on a terminal, feed it the run's wide fans."""
    last_read = 0.0
    while True:
        await asyncio.sleep(0.1 if progress.tty else 1.0)
        now = time.monotonic()
        if progress.tty and now - last_read >= FANS_READ_S:
            last_read = now
            detail = await engine.get_run_detail(run_id, summarize_fans_over=FANS_OVER)
            if detail is not None:
                progress.set_fans(snapshot_of(detail).fans)
        progress.tick()


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
