"""`durably schedules list|describe|pause|unpause|trigger|delete|backfill` — on a `drive=False`
engine.

The commands reach the schedules through `engine.schedules`: the persisted ones of the store
(`--store URL`), and with `--app APP` also the ones the app declares in code (listed as
`static`; pausing or deleting one is refused, as it is changed in code). An unknown id exits 1
with the error's message. Times are printed in UTC; `backfill --start/--end` take an ISO 8601
time with an offset (`2026-03-01T00:00:00Z`) or epoch milliseconds.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Annotated

import typer

from durably._cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    AppOpt,
    Args,
    CliError,
    JsonOpt,
    StoreOpt,
    bounded_int,
    confirm,
    dispatch,
    echo,
    exclusive,
    on_control_engine,
    print_json,
    usage_group,
)
from durably._cli.render import table
from durably._core.errors import ScheduleNotFoundError
from durably._engine.client.schedule_views import ScheduleDescription
from durably._engine.engine import Engine

__all__ = ["parse_when", "register"]

IdArg = Annotated[str, typer.Argument(metavar="ID", help="the schedule's id")]


def parse_when(text: str, option: str) -> int:
    """Epoch ms from `text`: digits are epoch milliseconds, else an ISO 8601 time that names
    its offset (a time without one is ambiguous, so it is refused)."""
    if text.isdigit():
        return int(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f"{option}: expected an ISO 8601 time such as 2026-03-01T00:00:00Z, or epoch "
            f"milliseconds; got {text!r}",
            EXIT_USAGE,
        ) from None
    if when.tzinfo is None:
        raise CliError(f"{option}: {text!r} has no UTC offset; add one (Z, +02:00, …)", EXIT_USAGE)
    return round(when.timestamp() * 1000)


def _at(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _cadence(d: ScheduleDescription) -> str:
    s = d.schedule
    if s.cron is not None:
        return f"cron {s.cron!r}" + (f" {s.timezone}" if s.timezone != "UTC" else "")
    return f"every {s.every_ms} ms"


def register(app: typer.Typer) -> None:
    group = usage_group(
        app,
        "schedules",
        "list, inspect, pause, trigger, backfill and delete schedules",
        "Schedules start a workflow once per window of an interval or a cron timetable. "
        "These commands manage the schedules kept in the store (created at run time) and "
        "show the ones an app declares in code (--app).",
    )

    @group.command("list", help="the schedules, static ones first, then by next fire")
    def _list_cmd(
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
        workflow: Annotated[
            str | None, typer.Option("--workflow", metavar="W", help="only schedules of W")
        ] = None,
        paused: Annotated[bool, typer.Option("--paused", help="only paused schedules")] = False,
        active: Annotated[bool, typer.Option("--active", help="only unpaused ones")] = False,
        limit: Annotated[
            int,
            typer.Option("--limit", metavar="N", callback=bounded_int(1, 1000), help="at most N"),
        ] = 100,
    ) -> None:
        dispatch(
            _list_handler,
            store=store,
            app=app,
            json=json,
            workflow=workflow,
            paused=paused,
            active=active,
            limit=limit,
        )

    @group.command("describe", help="one schedule: options, next fires, recent runs")
    def _describe_cmd(
        schedule_id: IdArg, store: StoreOpt = None, app: AppOpt = None, json: JsonOpt = False
    ) -> None:
        dispatch(_on_engine(_describe), schedule_id=schedule_id, store=store, app=app, json=json)

    @group.command("pause", help="stop firing a schedule (runs already started go on)")
    def _pause_cmd(
        schedule_id: IdArg,
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
        note: Annotated[
            str | None, typer.Option("--note", metavar="TEXT", help="why it is paused")
        ] = None,
    ) -> None:
        dispatch(
            _on_engine(_pause),
            schedule_id=schedule_id,
            store=store,
            app=app,
            json=json,
            note=note,
        )

    @group.command("unpause", help="fire a paused schedule again, from the current window")
    def _unpause_cmd(
        schedule_id: IdArg, store: StoreOpt = None, app: AppOpt = None, json: JsonOpt = False
    ) -> None:
        dispatch(_on_engine(_unpause), schedule_id=schedule_id, store=store, app=app, json=json)

    @group.command("trigger", help="start the schedule's run now (sched:ID:manual:<ms>)")
    def _trigger_cmd(
        schedule_id: IdArg, store: StoreOpt = None, app: AppOpt = None, json: JsonOpt = False
    ) -> None:
        dispatch(_on_engine(_trigger), schedule_id=schedule_id, store=store, app=app, json=json)

    @group.command("delete", help="delete a persisted schedule (asks first unless --yes)")
    def _delete_cmd(
        schedule_id: IdArg,
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
        yes: Annotated[
            bool, typer.Option("-y", "--yes", help="do not ask for confirmation")
        ] = False,
    ) -> None:
        dispatch(
            _on_engine(_delete),
            schedule_id=schedule_id,
            store=store,
            app=app,
            json=json,
            yes=yes,
        )

    @group.command(
        "backfill",
        help="start every window with START <= window < END (at most 10,000), oldest first",
    )
    def _backfill_cmd(
        schedule_id: IdArg,
        start: Annotated[
            str, typer.Option("--start", metavar="WHEN", help="ISO 8601 with offset, or epoch ms")
        ],
        end: Annotated[
            str, typer.Option("--end", metavar="WHEN", help="ISO 8601 with offset, or epoch ms")
        ],
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
    ) -> None:
        dispatch(
            _backfill_handler,
            schedule_id=schedule_id,
            start=start,
            end=end,
            store=store,
            app=app,
            json=json,
        )


def _on_engine(
    action: Callable[[Engine, Args], Awaitable[int]],
) -> Callable[[Args], int]:
    """`on_control_engine(action)`, with the schedule client's refusals (an unknown id, a
    static schedule, a bad span) printed as their message alone (exit 1)."""

    async def plain(engine: Engine, args: Args) -> int:
        try:
            return await action(engine, args)
        except (ScheduleNotFoundError, ValueError) as exc:
            raise CliError(str(exc)) from None

    return on_control_engine(plain)


def _list_handler(args: Args) -> int:
    exclusive(**{"--paused": args.paused, "--active": args.active})
    return _on_engine(_list)(args)


async def _list(engine: Engine, args: Args) -> int:
    paused = True if args.paused else False if args.active else None
    found = await engine.schedules.list(workflow=args.workflow, paused=paused, limit=args.limit)
    if args.json:
        print_json({"schedules": [d.to_json() for d in found]})
        return EXIT_OK
    if not found:
        echo("No schedules.")
        return EXIT_OK
    for line in table(
        ["ID", "WORKFLOW", "SOURCE", "CADENCE", "STATE", "NEXT FIRE", "LAST RUN"],
        [
            [
                d.schedule.id,
                d.schedule.workflow_name,
                d.source,
                _cadence(d),
                "paused" if d.schedule.paused else "active",
                _at(d.next_fires[0] if d.next_fires else None),
                d.last_run_id or "-",
            ]
            for d in found
        ],
    ):
        echo(line)
    return EXIT_OK


def _show(d: ScheduleDescription) -> None:
    s = d.schedule
    echo(f"Schedule {s.id} ({d.source}) — workflow {s.workflow_name}")
    echo(f"  cadence:     {_cadence(d)}")
    echo(
        f"  state:       {'paused' if s.paused else 'active'}" + (f" — {d.note}" if d.note else "")
    )
    echo(f"  overlap:     {s.overlap}, max_catchup {s.max_catchup}, jitter {s.jitter_ms} ms")
    echo(f"  next fires:  {', '.join(_at(t) for t in d.next_fires) or '-'}")
    echo(f"  last fired:  {_at(d.last_fire_at)} ({d.last_run_id or 'no run yet'})")
    echo(f"  fired:       {d.fired_count} run(s) by its timetable")
    if d.last_error:
        echo(f"  last error:  {d.last_error}")
    if d.recent_runs:
        echo("  recent runs:")
        for line in table(
            ["RUN", "STATUS", "WINDOW"],
            [
                [r.run_id, r.status, _at(r.window_ms) if r.window_ms is not None else "manual"]
                for r in d.recent_runs
            ],
        ):
            echo(f"    {line}")


def _report(d: ScheduleDescription, args: Args, done: str | None = None) -> int:
    if args.json:
        print_json(d.to_json())
    elif done is not None:
        echo(done)
    else:
        _show(d)
    return EXIT_OK


async def _describe(engine: Engine, args: Args) -> int:
    return _report(await engine.schedules.describe(args.schedule_id), args)


async def _pause(engine: Engine, args: Args) -> int:
    d = await engine.schedules.pause(args.schedule_id, note=args.note)
    return _report(d, args, f"Schedule {d.schedule.id} paused.")


async def _unpause(engine: Engine, args: Args) -> int:
    d = await engine.schedules.unpause(args.schedule_id)
    return _report(d, args, f"Schedule {d.schedule.id} unpaused.")


async def _trigger(engine: Engine, args: Args) -> int:
    handle = await engine.schedules.trigger(args.schedule_id)
    if args.json:
        print_json({"runId": handle.run_id})
    else:
        echo(f"Started run {handle.run_id}.")
    return EXIT_OK


async def _delete(engine: Engine, args: Args) -> int:
    d = await engine.schedules.describe(args.schedule_id)  # unknown: ScheduleNotFoundError
    if not args.yes and d.source == "persisted":
        if not confirm(f"Delete schedule {d.schedule.id} ({d.schedule.workflow_name})?"):
            echo(f"Schedule {d.schedule.id} kept.", sys.stderr)
            return EXIT_FAILED
    await engine.schedules.delete(args.schedule_id)
    if args.json:
        print_json({"id": args.schedule_id, "deleted": True})
    else:
        echo(f"Schedule {args.schedule_id} deleted (the runs it started are kept).")
    return EXIT_OK


def _backfill_handler(args: Args) -> int:
    args.start_ms = parse_when(args.start, "--start")  # before the store is opened
    args.end_ms = parse_when(args.end, "--end")
    return _on_engine(_backfill)(args)


async def _backfill(engine: Engine, args: Args) -> int:
    started = await engine.schedules.backfill(args.schedule_id, args.start_ms, args.end_ms)
    if args.json:
        print_json({"runIds": started})
    else:
        for run_id in started:
            echo(run_id)
        echo(f"{len(started)} window(s) started (a window that had run already is kept as is).")
    return EXIT_OK
