"""`durably runs watch RUN_ID`: follow a run until it settles, then exit with its outcome.

It reads the run through the read side every `--interval` (wide fans summarised, so a
40,000-member fan costs one row) and renders what changed: on a terminal a rich live view
(status, step counts, a bar per fan, the latest steps); otherwise one plain line per change.
It ends when the run is completed (exit 0) or failed, cancelled or dead (exit 1). `--json`
prints one JSON object per change, one per line (the last carries the settled status).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Annotated, Any, TextIO

import typer

from durably._cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    AppOpt,
    Args,
    CliError,
    JsonOpt,
    StoreOpt,
    bounded_int,
    compact_json,
    dispatch,
    echo,
    on_control_engine,
)
from durably._cli.runstate import RunSnapshot, snapshot_of, snapshot_view
from durably._core.models import WorkflowRun
from durably._engine.engine import Engine

__all__ = ["follow", "outcome_code", "register"]

# The fans wider than this are read as one summary row.
FANS_OVER = 20


def register(runs: typer.Typer) -> None:
    @runs.command(
        "watch",
        short_help="follow a run until it settles; exit 0 if it completed, 1 otherwise",
        help=(
            "Follow the run: its status, step counts and fans as they change (a live view on "
            "a terminal, a line per change otherwise, one JSON object per change with "
            "--json), until it is completed (exit 0) or failed, cancelled or dead (exit 1). "
            "Reads only: workers sharing the store do the work."
        ),
    )
    def _watch_cmd(
        run_id: Annotated[str, typer.Argument(metavar="RUN_ID")],
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
        interval: Annotated[
            int,
            typer.Option(
                "--interval",
                metavar="MS",
                callback=bounded_int(50, 60_000),
                help="read the run every MS milliseconds",
            ),
        ] = 500,
        timeout: Annotated[
            float | None,
            typer.Option(
                "--timeout",
                metavar="SECONDS",
                help="give up after SECONDS (exit 1; the run goes on)",
            ),
        ] = None,
    ) -> None:
        dispatch(
            on_control_engine(_watch),
            run_id=run_id,
            store=store,
            app=app,
            json=json,
            interval=interval,
            timeout=timeout,
        )


def outcome_code(run: WorkflowRun) -> int:
    """0 for a completed run, 1 for a failed, cancelled or dead one."""
    return EXIT_OK if run.status == "completed" else EXIT_FAILED


async def _watch(engine: Engine, args: Args) -> int:
    if await engine.get_run(args.run_id) is None:
        raise CliError(f"Run {args.run_id} not found.")
    mode = "json" if args.json else None
    try:
        run = await follow(
            engine,
            args.run_id,
            sys.stdout,
            mode=mode,
            interval_s=args.interval / 1000,
            timeout=args.timeout,
        )
    except TimeoutError as exc:
        raise CliError(
            f"run {args.run_id} is still {exc} after {args.timeout:g}s; it goes on "
            f"(durably runs watch {args.run_id} follows it again)"
        ) from None
    if not args.json:
        if run.status == "completed":
            echo(f"run {run.id} completed: {compact_json(run.output, 200)}")
        else:
            message = run.error.message if run.error else run.status
            code = f" [{run.error.code}]" if run.error and run.error.code else ""
            echo(f"run {run.id} {run.status}: {message}{code}")
    return outcome_code(run)


async def follow(
    engine: Engine,
    run_id: str,
    stream: TextIO,
    *,
    mode: str | None = None,
    interval_s: float = 0.5,
    timeout: float | None = None,
) -> WorkflowRun:
    """Render the run to `stream` as it changes until it is terminal; the terminal run.
    `TimeoutError` (its message the run's status) when `timeout` seconds pass first.

    `mode`: "live" (rich), "plain" (a line per change), "json" (an object per change) or
    None (live when `stream` is a terminal, else plain)."""
    chosen = mode or ("live" if stream.isatty() else "plain")
    view = _LiveView(stream) if chosen == "live" else None
    began = time.monotonic()
    last: RunSnapshot | None = None
    try:
        while True:
            detail = await engine.get_run_detail(run_id, summarize_fans_over=FANS_OVER)
            if detail is None:
                raise CliError(f"Run {run_id} is gone (deleted while it was watched).")
            snap = snapshot_of(detail)
            if view is not None:
                view.show(snap, time.monotonic() - began)
            elif last is None or snap.changed_from(last):
                if chosen == "json":
                    stream.write(compact_json(snap.to_json()) + "\n")
                else:
                    for line in snap.lines_since(last):
                        stream.write(f"{time.monotonic() - began:7.2f}s  {line}\n")
                stream.flush()
            last = snap
            if detail.run.is_terminal:
                return detail.run
            if timeout is not None and time.monotonic() - began >= timeout:
                raise TimeoutError(detail.run.status)
            await asyncio.sleep(interval_s)
    finally:
        if view is not None:
            view.close()


class _LiveView:
    """The rich live display of `follow` on a terminal."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console(file=stream, highlight=False)
        self.live: Any = Live(console=self.console, auto_refresh=False, transient=False)
        self.live.start()

    def show(self, snap: RunSnapshot, elapsed_s: float) -> None:
        self.live.update(snapshot_view(snap, elapsed_s), refresh=True)

    def close(self) -> None:
        self.live.stop()
