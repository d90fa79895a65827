"""`durably demo`: run the bundled order workflow on the embedded SQLite default."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

from durably._cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    Args,
    CliError,
    check_store_url,
    compact_json,
    dispatch,
    display_url,
    echo,
    print_json,
    sqlite_file_of,
)
from durably._cli.progress import Progress
from durably._cli.render import format_duration, timeline
from durably._cli.runs import children_of
from durably._core.models import StepCheckpoint, WorkflowRun
from durably._engine.engine import Engine

DEMO_STORE = "sqlite:///durably-demo.db"
APPROVAL = {"approvedBy": "durably demo"}


def register(app: typer.Typer) -> None:
    @app.command(
        "demo",
        short_help="run the bundled order workflow (steps, a retry, a signal, a sleep, a child)",
        help=(
            "Run the bundled example (durably/examples/orders.py) on the embedded SQLite "
            "default and show what the engine records. The default demo database "
            "./durably-demo.db is recreated on every run."
        ),
    )
    def _demo_cmd(
        store: Annotated[
            str | None,
            typer.Option(
                "--store",
                metavar="URL",
                help=f"store URL (default {DEMO_STORE}, deleted and recreated first)",
            ),
        ] = None,
        json: Annotated[
            bool, typer.Option("--json", help="print the finished run as JSON only")
        ] = False,
        timeout: Annotated[
            float, typer.Option("--timeout", metavar="SECONDS", help="give up after SECONDS")
        ] = 30.0,
    ) -> None:
        dispatch(run, store=store, json=json, timeout=timeout)


def _remove_demo_db(url: str) -> None:
    path = sqlite_file_of(url)
    if path is None:
        return
    for candidate in (path, *(Path(f"{path}{s}") for s in ("-wal", "-shm", "-journal"))):
        with contextlib.suppress(FileNotFoundError):
            candidate.unlink()


def run(args: Args) -> int:
    url: str = args.store or DEMO_STORE
    check_store_url(url, must_exist=False)
    if args.store is None:
        _remove_demo_db(url)  # only ever the demo's own file
        run_id = "order-1001"
    else:
        run_id = f"order-{uuid.uuid4().hex[:6]}"
    return asyncio.run(_demo(url, run_id, args.json, args.timeout))


async def _demo(url: str, run_id: str, as_json: bool, timeout: float) -> int:
    from durably.examples import orders

    quiet = as_json
    out = sys.stdout
    progress = Progress(out) if not quiet else None
    if not quiet:
        echo("durably demo — an order workflow (durably/examples/orders.py)")
        echo(f"store: {display_url(url)}")
        echo(
            f"run {run_id}: reserve stock → wait for the 'approve' signal → charge the card "
            "(fails once, retried) → durable 1s sleep → shipping child workflow → receipt"
        )
        echo()
    engine = orders.make_engine(url)
    began = time.monotonic()
    try:
        async with engine:
            unsubscribe = engine.subscribe(progress) if progress is not None else None
            ticker = asyncio.create_task(_tick(progress)) if progress is not None else None
            try:
                run = await asyncio.wait_for(
                    _drive(engine, orders, run_id, progress), timeout=timeout
                )
            except TimeoutError:
                raise CliError(
                    f"the demo did not finish within {timeout:g}s (run {run_id}); inspect it "
                    f"with `durably runs show {run_id} --store {url}`"
                ) from None
            finally:
                if ticker is not None:
                    ticker.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await ticker
                if unsubscribe is not None:
                    unsubscribe()
                if progress is not None:
                    progress.finish()
            checkpoints = await engine.list_checkpoints(run_id)
            children = await children_of(engine, checkpoints)
    finally:
        await engine.close()
    elapsed_ms = (time.monotonic() - began) * 1000
    if as_json:
        print_json(
            {
                "run": run.to_json(),
                "checkpoints": [cp.to_json() for cp in checkpoints],
                "children": [
                    {"run": c.to_json(), "checkpoints": [cp.to_json() for cp in cps]}
                    for c, cps in children
                ],
            }
        )
        return EXIT_OK if run.status == "completed" else EXIT_FAILED
    _print_report(run, checkpoints, children, url, elapsed_ms)
    return EXIT_OK if run.status == "completed" else EXIT_FAILED


async def _tick(progress: Progress | None) -> None:
    while progress is not None:
        await asyncio.sleep(0.1)
        progress.tick()


async def _drive(
    engine: Engine, orders: Any, run_id: str, progress: Progress | None
) -> WorkflowRun:
    handle = await engine.start(orders.process_order, orders.Order.example(run_id), run_id=run_id)
    token = orders.approval_token(run_id)
    # The run parks on `ctx.wait_for_signal(token)`; once it does, approve it, as an operator
    # would from anywhere: `durably runs signal <token> --payload '{...}'`.
    while True:
        run = await handle.wait()
        if run.is_terminal:
            return run
        if run.status == "suspended" and await engine.store.list_signal_waiters(token):
            break
        await asyncio.sleep(0.05)
    if progress is not None:
        progress.note(f"⏸ run is waiting for signal {token!r}")
        progress.note(f"→ sending it: engine.signal({token!r}, {compact_json(APPROVAL)})")
    await engine.signal(token, APPROVAL)
    return await engine.wait_for_run(run_id, until="terminal")


def _print_report(
    run: WorkflowRun,
    checkpoints: list[StepCheckpoint],
    children: list[tuple[WorkflowRun, list[StepCheckpoint]]],
    url: str,
    elapsed_ms: float,
) -> None:
    echo()
    echo(f"timeline of {run.id} ({run.workflow} v{run.workflow_version}) — {run.status}")
    for line in timeline(checkpoints):
        echo(line)
    for child, cps in children:
        echo()
        echo(f"  child {child.id} ({child.workflow}) — {child.status}")
        for line in timeline(cps, indent="    "):
            echo(line)
    echo()
    if run.status == "completed":
        echo("output:")
        echo(compact_json(run.output) if run.output is None else _pretty(run.output))
    elif run.error is not None:
        echo(f"error: {run.error.message}")
    echo()
    echo(f"run {run.status} in {format_duration(elapsed_ms)}. Inspect it again with:")
    echo(f"  durably runs show {run.id} --store {display_url(url)}")
    echo(f"  durably runs list --store {display_url(url)}")


def _pretty(value: Any) -> str:
    import json

    return json.dumps(value, indent=2, ensure_ascii=False)
