"""`durably runs list|show|cancel|retry|continue|redispatch|signal` — on a `drive=False` engine
(`delete`, `prune`, `fork`, `export`, `watch` and `workers` come from their own modules).

These commands never execute a run: they read the store, or change it and let the workers
sharing the store do the work (a signal nudges the run's wakeAt so its holder's timer poll
wakes it; a retried run goes back to `pending` for any worker's poller).
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, get_args

import typer

from durably._cli import delete, export, fork, health, prune
from durably._cli.common import (
    EXIT_OK,
    AppOpt,
    Args,
    CliError,
    JsonOpt,
    StoreOpt,
    bounded_int,
    dispatch,
    echo,
    on_control_engine,
    parse_json_arg,
    print_json,
    usage_group,
)
from durably._cli.fanview import fan_page_lines, summarized_timeline
from durably._cli.render import relative_time, run_detail, runs_table, table
from durably._cli.signals import human_duration
from durably._core.errors import ReservedTokenError, SignalBufferFullError
from durably._core.models import RunResult, RunStatus, StepCheckpoint, WorkflowRun, now_utc
from durably._engine.engine import Engine
from durably._read import rows as row_views
from durably._read.models import RunDetail

# Fans wider than this are drawn as one row (`summarize_fans_over` of the read side).
FANS_OVER = 20
# How much of a blocked run's reason `runs list` shows (`runs show` has all of it).
REASON_WIDTH = 100

STATUSES: tuple[str, ...] = get_args(RunStatus)


RunIdArg = Annotated[str, typer.Argument(metavar="RUN_ID")]


def register(app: typer.Typer) -> typer.Typer:
    """`durably runs …`; the group is returned for the verbs other modules add to it."""
    runs = usage_group(
        app,
        "runs",
        "list, inspect and control runs (never executes them)",
        "List, inspect and control runs through a drive=False engine: these commands "
        "never execute a run. Workers sharing the store do the work (a signal makes the "
        "waiting run due so its worker wakes it; a retried run goes back to pending).",
    )

    @runs.command("list", help="list runs, newest first")
    def _list_cmd(
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
        status: Annotated[
            str | None,
            typer.Option(
                "--status",
                metavar="|".join(STATUSES),
                callback=_status_option,
                help="only runs with this status",
            ),
        ] = None,
        workflow: Annotated[
            str | None,
            typer.Option("--workflow", metavar="NAME", help="only runs of this workflow"),
        ] = None,
        tag: Annotated[
            str | None, typer.Option("--tag", metavar="TAG", help="only runs carrying this tag")
        ] = None,
        limit: Annotated[
            int,
            typer.Option("--limit", metavar="N", callback=bounded_int(1), help="at most N"),
        ] = 50,
    ) -> None:
        dispatch(
            on_control_engine(_list),
            store=store,
            app=app,
            json=json,
            status=status,
            workflow=workflow,
            tag=tag,
            limit=limit,
        )

    @runs.command("show", help="a run and its checkpoint timeline")
    def _show_cmd(
        run_id: RunIdArg,
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
        fans_over: Annotated[
            int,
            typer.Option(
                "--fans-over",
                metavar="N",
                callback=bounded_int(1),
                help="draw a fan wider than N members as one row",
            ),
        ] = FANS_OVER,
        fan: Annotated[
            str | None,
            typer.Option("--fan", metavar="GROUP", help="page the members of this fan instead"),
        ] = None,
        offset: Annotated[int, typer.Option("--offset", metavar="N", help="first member")] = 0,
        limit: Annotated[
            int,
            typer.Option("--limit", metavar="N", callback=bounded_int(1), help="page size"),
        ] = 50,
        failed: Annotated[
            bool, typer.Option("--failed", help="with --fan: failed members only")
        ] = False,
        engine_rows: Annotated[
            bool,
            typer.Option(
                "--engine-rows",
                help="also draw the rows the engine writes for itself (the deadline of a "
                "wait with a timeout), labelled as such; --json always has them, marked "
                "`row.engine`",
            ),
        ] = False,
    ) -> None:
        dispatch(
            on_control_engine(_show),
            run_id=run_id,
            store=store,
            app=app,
            json=json,
            fans_over=fans_over,
            fan=fan,
            offset=offset,
            limit=limit,
            failed=failed,
            engine_rows=engine_rows,
        )

    def control_verb(
        name: str,
        help: str,
        action: Callable[[Engine, Args], Awaitable[int]],
        short_help: str | None = None,
    ) -> None:
        @runs.command(name, help=help, short_help=short_help)
        def _verb(
            run_id: RunIdArg, store: StoreOpt = None, app: AppOpt = None, json: JsonOpt = False
        ) -> None:
            dispatch(on_control_engine(action), run_id=run_id, store=store, app=app, json=json)

    control_verb("cancel", "cancel a run (and its children)", _cancel)

    @runs.command(
        "retry",
        short_help="re-enqueue a failed/dead run from where it failed (requeue)",
        help=(
            "Re-enqueue a failed, dead or cancelled run from where it failed. With --input, "
            "start a fresh run of the same workflow with that input instead "
            "(engine.retry_with_input) and print its id."
        ),
    )
    def _retry_cmd(
        run_id: RunIdArg,
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
        input: Annotated[
            str | None,
            typer.Option(
                "--input",
                metavar="JSON",
                help="run again from the start with this input (`@file` reads a file, `-` stdin)",
            ),
        ] = None,
    ) -> None:
        dispatch(
            on_control_engine(_retry),
            run_id=run_id,
            store=store,
            app=app,
            json=json,
            input=input,
        )

    control_verb("continue", "release the run's pending ctx.breakpoint()", _continue)
    control_verb(
        "redispatch",
        "re-dispatch the run's pending remote steps (engine.redispatch_pending): every "
        "remote step of the run still waiting for its answer (a `pending` row) is marked as "
        "its next attempt and the run is re-driven",
        _redispatch,
        short_help="re-dispatch the run's pending remote steps (engine.redispatch_pending)",
    )

    @runs.command(
        "signal",
        short_help="deliver a signal (ctx.wait_for_signal) by token",
        help=(
            "Deliver a signal to the run waiting on TOKEN. When no run waits on it yet, the "
            "signal is buffered (bounded: it expires, and a full buffer refuses it) for the "
            "next wait on that token; --no-buffer stores nothing instead. Tokens of the "
            "engine's own waits (child:, bp:, update:, event:, …) are refused: use `runs "
            "continue` for a breakpoint."
        ),
    )
    def _signal_cmd(
        token: Annotated[str, typer.Argument(metavar="TOKEN")],
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
        payload: Annotated[
            str | None,
            typer.Option(
                "--payload",
                metavar="JSON",
                help="JSON payload (`@file` reads a file, `-` stdin); default null",
            ),
        ] = None,
        no_buffer: Annotated[
            bool,
            typer.Option(
                "--no-buffer",
                help="deliver only to a run waiting now; store nothing otherwise (exit 1)",
            ),
        ] = False,
    ) -> None:
        dispatch(
            on_control_engine(_signal),
            token=token,
            store=store,
            app=app,
            json=json,
            payload=payload,
            no_buffer=no_buffer,
        )

    delete.register(runs)
    prune.register(runs)
    fork.register(runs)
    export.register(runs)
    health.register(runs)
    return runs


def _status_option(value: str | None) -> str | None:
    if value is not None and value not in STATUSES:
        raise typer.BadParameter(f"expected one of {', '.join(STATUSES)}, not {value!r}")
    return value


async def _require_run(engine: Engine, run_id: str) -> WorkflowRun:
    run = await engine.get_run(run_id)
    if run is None:
        raise CliError(f"Run {run_id} not found.")
    return run


def _result_json(result: RunResult | None, run: WorkflowRun) -> dict[str, Any]:
    if result is None:
        return {"runId": run.id, "status": run.status}
    return result.to_json()


# ------------------------------------------------------------------ list / show


async def _list(engine: Engine, args: Args) -> int:
    query: dict[str, Any] = {"limit": args.limit}
    if args.status:
        query["status"] = args.status
    if args.workflow:
        query["workflow"] = args.workflow
    if args.tag:
        query["tag"] = args.tag
    runs = await engine.list_runs(**query)
    if args.json:
        print_json([r.to_json() for r in runs])
    else:
        for line in runs_list_lines(runs):
            echo(line)
    return EXIT_OK


def runs_list_lines(runs: list[WorkflowRun]) -> list[str]:
    """The run table; when a listed run is `blocked` (no worker serves its workflow, or none
    offers what its next step requires), a REASON column says why, so an operator sees a
    parked run for what it is without opening it."""
    if not any(_reason(r) for r in runs):
        return runs_table(runs)
    now = now_utc()
    rows = [
        [r.id, r.workflow, r.status, relative_time(r.updated_at, now), _reason(r)] for r in runs
    ]
    return table(["RUN", "WORKFLOW", "STATUS", "UPDATED", "REASON"], rows)


def _reason(run: WorkflowRun) -> str:
    if run.status != "blocked" or run.error is None:
        return ""
    # The message is read from the store: no control characters reach the terminal.
    text = "".join(c if c.isprintable() else "?" for c in run.error.message)
    code = f"[{run.error.code}] " if run.error.code else ""
    return (code + text)[:REASON_WIDTH]


async def waiting_for(engine: Engine, run_id: str) -> list[str]:
    """The signal / event tokens the run is parked on (children are shown separately), and
    what the read side says in words when no worker serves it (its workflow, or the token
    of a remote step it waits on)."""
    tokens = []
    said = (await engine.waiting_for([run_id])).get(run_id)
    if said is not None and said.detail:
        tokens.append("".join(c if c.isprintable() else "?" for c in said.detail))
    for waiter in await engine.store.list_signal_waiters(""):
        if waiter.run_id != run_id or waiter.token.startswith("child:"):
            continue
        token = waiter.token
        if token.startswith("event:"):
            try:
                name = base64.b64decode(token.split(":")[1]).decode("utf-8")
                token = f"event {name!r} (durably publishes events; not a signal)"
            except Exception:
                pass
        tokens.append(token)
    return tokens


async def children_of(
    engine: Engine, checkpoints: list[StepCheckpoint]
) -> list[tuple[WorkflowRun, list[StepCheckpoint]]]:
    found = []
    for cp in checkpoints:
        if cp.name.startswith("signal:child:"):
            child = await engine.get_run(cp.name[len("signal:child:") :])
            if child is not None:
                found.append((child, await engine.list_checkpoints(child.id)))
    return found


async def _show(engine: Engine, args: Args) -> int:
    """The run through the read side (`get_run_detail`): wide fans summarised, so a run with
    a 40,000-member fan prints (and reads) a screenful, not 40,000 rows."""
    if args.fan:
        return await _show_fan(engine, args)
    detail = await engine.get_run_detail(args.run_id, summarize_fans_over=args.fans_over)
    if detail is None:
        raise CliError(f"Run {args.run_id} not found.")
    run = detail.run
    waits = [] if run.is_terminal else await waiting_for(engine, run.id)
    # The engine's clock (the app's, when it injects one): its rows were stamped by it.
    now = engine.clock()
    if args.json:
        print_json({**detail_json(detail, now), "waitingFor": waits})
        return EXIT_OK
    children = await children_of(engine, list(detail.timeline))
    lines = run_detail(
        run,
        list(detail.timeline),
        waiting_for=waits,
        children=children,
        render_timeline=lambda cps: summarized_timeline(
            cps, detail.fans or (), run_id=run.id, now_ms=now, engine_rows=args.engine_rows
        ),
        now_ms=now,
        engine_rows=args.engine_rows,
    )
    for line in lines:
        echo(line)
    return EXIT_OK


async def _show_fan(engine: Engine, args: Args) -> int:
    page = await engine.get_fan_members(
        args.run_id,
        args.fan,
        offset=max(0, args.offset),
        limit=args.limit,
        failed_only=args.failed,
    )
    if page is None:
        raise CliError(f"Run {args.run_id} not found.")
    now = engine.clock()
    if args.json:
        body = page.to_json()
        body["items"] = row_views.annotate(
            page.items, row_views.describe_rows(page.items, now), now
        )
        print_json(body)
        return EXIT_OK
    for line in fan_page_lines(args.fan, page, max(0, args.offset), now_ms=now):
        echo(line)
    return EXIT_OK


def detail_json(detail: RunDetail, now_ms: int) -> dict[str, Any]:
    """The detail's JSON with each row's view added under `row` (what it stands for, its
    true duration, whether the engine wrote it: `durably._read.rows`), as the console's
    API gives it; every other field is `RunDetail.to_json`'s, unchanged."""
    body: dict[str, Any] = detail.to_json()
    body["timeline"] = row_views.annotate(
        detail.timeline, row_views.describe_rows(detail.timeline, now_ms), now_ms
    )
    for fan, fan_json in zip(detail.fans or (), body.get("fans", ()), strict=True):
        if fan.failures:
            fan_json["failures"] = row_views.annotate(fan.failures, None, now_ms)
    return body


# ------------------------------------------------------------------ control


async def _cancel(engine: Engine, args: Args) -> int:
    run = await _require_run(engine, args.run_id)
    if run.status in ("completed", "failed", "cancelled", "dead"):
        message = f"Run {run.id} is already {run.status}; nothing to cancel."
        if args.json:
            print_json({"runId": run.id, "status": run.status, "changed": False})
        else:
            echo(message)
        return EXIT_OK
    result = await engine.cancel(run.id)
    if args.json:
        print_json({**_result_json(result, run), "changed": True})
    else:
        status = result.status if result else "cancelled"
        echo(f"Run {run.id} marked {status}.")
    return EXIT_OK


async def _retry(engine: Engine, args: Args) -> int:
    run = await _require_run(engine, args.run_id)
    if getattr(args, "input", None) is not None:
        value = parse_json_arg(args.input, "--input")
        new_id = await engine.retry_with_input(run.id, value)
        if new_id is None:
            raise CliError(f"Run {run.id} not found.")
        if args.json:
            print_json({"runId": new_id, "retriedRunId": run.id, "status": "pending"})
        else:
            echo(f"Run {new_id} started with the new input (a retry of {run.id}).")
        return EXIT_OK
    if run.status == "completed":
        raise CliError(f"Run {run.id} is completed; there is nothing to retry.")
    if run.status in ("pending", "running"):
        raise CliError(f"Run {run.id} is {run.status}; it is not waiting to be retried.")
    result = await engine.retry(run.id)
    if args.json:
        print_json(_result_json(result, run))
    else:
        echo(f"Run {run.id} re-enqueued (was {run.status}); a worker picks it up.")
    return EXIT_OK


async def _continue(engine: Engine, args: Args) -> int:
    run = await _require_run(engine, args.run_id)
    result = await engine.continue_run(run.id)
    if result is None:
        raise CliError(f"Run {run.id} is not paused at a breakpoint ({run.status}).")
    if args.json:
        print_json(_result_json(result, run))
    else:
        echo(f"Run {run.id} continued past its breakpoint.")
    return EXIT_OK


async def _redispatch(engine: Engine, args: Args) -> int:
    run = await _require_run(engine, args.run_id)
    result = await engine.redispatch_pending(run.id)
    count = int(result["redispatched"]) if result is not None else 0
    if args.json:
        print_json(result if result is not None else {"runId": run.id, "redispatched": 0})
    elif count:
        echo(f"Run {run.id}: {count} pending remote step(s) re-dispatched.")
    else:
        echo(f"Run {run.id} has no pending remote step; nothing re-dispatched.")
    return EXIT_OK


async def _signal(engine: Engine, args: Args) -> int:
    payload = parse_json_arg(args.payload, "--payload")
    try:
        result = await engine.signal(args.token, payload, buffer=not args.no_buffer)
    except (ReservedTokenError, SignalBufferFullError) as exc:
        raise CliError(str(exc)) from None
    if result is None and args.no_buffer:
        raise CliError(
            f"No run is waiting for {args.token!r}; nothing was delivered or stored (--no-buffer)."
        )
    if args.json:
        print_json(
            {"token": args.token, "delivered": result is not None}
            | ({"run": result.to_json()} if result is not None else {})
        )
    elif result is None:
        ttl = human_duration(engine.signal_buffer.ttl_ms)
        echo(
            f"No run is waiting for {args.token!r} yet; the signal is buffered for {ttl} and "
            "the next ctx.wait_for_signal on that token receives it (`durably signals list`)."
        )
    else:
        echo(f"Signal {args.token!r} delivered to run {result.run_id} ({result.status}).")
    return EXIT_OK


__all__ = ["children_of", "register", "waiting_for"]
