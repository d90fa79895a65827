"""`durably runs list|show|cancel|retry|continue|signal|workers` — on a `drive=False` engine.

These commands never execute a run: they read the store, or change it and let the workers
sharing the store do the work (a signal nudges the run's wakeAt so its holder's timer poll
wakes it; a retried run goes back to `pending` for any worker's poller).
"""

from __future__ import annotations

import argparse
import base64
from typing import Any, get_args

from durably._cli import health
from durably._cli.common import (
    EXIT_OK,
    CliError,
    bounded_int,
    echo,
    on_control_engine,
    parse_json_arg,
    print_json,
    show_usage,
    target_options,
)
from durably._cli.fanview import fan_page_lines, summarized_timeline
from durably._cli.render import relative_time, run_detail, runs_table, table
from durably._cli.signals import human_duration
from durably._core.errors import ReservedTokenError, SignalBufferFullError
from durably._core.models import RunResult, RunStatus, StepCheckpoint, WorkflowRun, now_utc
from durably._engine.engine import Engine

# Fans wider than this are drawn as one row (`summarize_fans_over` of the read side).
FANS_OVER = 20
# How much of a blocked run's reason `runs list` shows (`runs show` has all of it).
REASON_WIDTH = 100

STATUSES: tuple[str, ...] = get_args(RunStatus)


def add_parser(sub: Any) -> None:
    runs = sub.add_parser(
        "runs",
        help="list, inspect and control runs (never executes them)",
        description=(
            "List, inspect and control runs through a drive=False engine: these commands "
            "never execute a run. Workers sharing the store do the work (a signal makes the "
            "waiting run due so its worker wakes it; a retried run goes back to pending)."
        ),
    )
    verbs = runs.add_subparsers(dest="verb", metavar="ACTION")
    runs.set_defaults(handler=lambda _args: show_usage(runs))

    p = verbs.add_parser("list", help="list runs, newest first")
    target_options(p)
    p.add_argument("--status", choices=STATUSES, help="only runs with this status")
    p.add_argument("--workflow", metavar="NAME", help="only runs of this workflow")
    p.add_argument("--tag", metavar="TAG", help="only runs carrying this tag")
    p.add_argument("--limit", type=bounded_int(1), default=50, metavar="N", help="at most N (50)")
    p.set_defaults(handler=on_control_engine(_list))

    p = verbs.add_parser("show", help="a run and its checkpoint timeline")
    target_options(p)
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument(
        "--fans-over",
        type=bounded_int(1),
        default=FANS_OVER,
        metavar="N",
        help=f"draw a fan wider than N members as one row ({FANS_OVER})",
    )
    p.add_argument("--fan", metavar="GROUP", help="page the members of this fan instead")
    p.add_argument("--offset", type=int, default=0, metavar="N", help="first member (0)")
    p.add_argument("--limit", type=bounded_int(1), default=50, metavar="N", help="page size (50)")
    p.add_argument("--failed", action="store_true", help="with --fan: failed members only")
    p.set_defaults(handler=on_control_engine(_show))

    p = verbs.add_parser("cancel", help="cancel a run (and its children)")
    target_options(p)
    p.add_argument("run_id", metavar="RUN_ID")
    p.set_defaults(handler=on_control_engine(_cancel))

    p = verbs.add_parser(
        "retry", help="re-enqueue a failed/dead run from where it failed (requeue)"
    )
    target_options(p)
    p.add_argument("run_id", metavar="RUN_ID")
    p.set_defaults(handler=on_control_engine(_retry))

    p = verbs.add_parser("continue", help="release the run's pending ctx.breakpoint()")
    target_options(p)
    p.add_argument("run_id", metavar="RUN_ID")
    p.set_defaults(handler=on_control_engine(_continue))

    p = verbs.add_parser(
        "redispatch",
        help="re-dispatch the run's pending remote steps (engine.redispatch_pending)",
        description=(
            "Mark every remote step of the run still waiting for its answer (a `pending` "
            "row) as its next attempt and re-drive the run: engine.redispatch_pending."
        ),
    )
    target_options(p)
    p.add_argument("run_id", metavar="RUN_ID")
    p.set_defaults(handler=on_control_engine(_redispatch))

    p = verbs.add_parser(
        "signal",
        help="deliver a signal (ctx.wait_for_signal) by token",
        description=(
            "Deliver a signal to the run waiting on TOKEN. When no run waits on it yet, the "
            "signal is buffered (bounded: it expires, and a full buffer refuses it) for the "
            "next wait on that token; --no-buffer stores nothing instead. Tokens of the "
            "engine's own waits (child:, bp:, update:, event:, …) are refused: use `runs "
            "continue` for a breakpoint."
        ),
    )
    target_options(p)
    p.add_argument("token", metavar="TOKEN")
    p.add_argument(
        "--payload",
        metavar="JSON",
        help="JSON payload (`@file` reads a file, `-` stdin); default null",
    )
    p.add_argument(
        "--no-buffer",
        action="store_true",
        help="deliver only to a run waiting now; store nothing otherwise (exit 1)",
    )
    p.set_defaults(handler=on_control_engine(_signal))

    health.add_verb(verbs)


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


async def _list(engine: Engine, args: argparse.Namespace) -> int:
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
    """The signal / event tokens the run is parked on (children are shown separately)."""
    tokens = []
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


async def _show(engine: Engine, args: argparse.Namespace) -> int:
    """The run through the read side (`get_run_detail`): wide fans summarised, so a run with
    a 40,000-member fan prints (and reads) a screenful, not 40,000 rows."""
    if args.fan:
        return await _show_fan(engine, args)
    detail = await engine.get_run_detail(args.run_id, summarize_fans_over=args.fans_over)
    if detail is None:
        raise CliError(f"Run {args.run_id} not found.")
    run = detail.run
    waits = [] if run.is_terminal else await waiting_for(engine, run.id)
    if args.json:
        print_json({**detail.to_json(), "waitingFor": waits})
        return EXIT_OK
    children = await children_of(engine, list(detail.timeline))
    lines = run_detail(
        run,
        list(detail.timeline),
        waiting_for=waits,
        children=children,
        render_timeline=lambda cps: summarized_timeline(cps, detail.fans or ()),
    )
    for line in lines:
        echo(line)
    return EXIT_OK


async def _show_fan(engine: Engine, args: argparse.Namespace) -> int:
    page = await engine.get_fan_members(
        args.run_id,
        args.fan,
        offset=max(0, args.offset),
        limit=args.limit,
        failed_only=args.failed,
    )
    if page is None:
        raise CliError(f"Run {args.run_id} not found.")
    if args.json:
        print_json(page.to_json())
        return EXIT_OK
    for line in fan_page_lines(args.fan, page, max(0, args.offset)):
        echo(line)
    return EXIT_OK


# ------------------------------------------------------------------ control


async def _cancel(engine: Engine, args: argparse.Namespace) -> int:
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


async def _retry(engine: Engine, args: argparse.Namespace) -> int:
    run = await _require_run(engine, args.run_id)
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


async def _continue(engine: Engine, args: argparse.Namespace) -> int:
    run = await _require_run(engine, args.run_id)
    result = await engine.continue_run(run.id)
    if result is None:
        raise CliError(f"Run {run.id} is not paused at a breakpoint ({run.status}).")
    if args.json:
        print_json(_result_json(result, run))
    else:
        echo(f"Run {run.id} continued past its breakpoint.")
    return EXIT_OK


async def _redispatch(engine: Engine, args: argparse.Namespace) -> int:
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


async def _signal(engine: Engine, args: argparse.Namespace) -> int:
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


__all__ = ["add_parser", "children_of", "waiting_for"]
