"""`durably runs workers`: worker health and the workflows the live workers announce.

Worker groups come from the store (`runs@<namespace>`: backlog and the owners of live run
leases) and, with `--transport URL`, from that broker: one group per routing token with its
queue depth and every worker beating on it. A drive=False engine reads them; nothing here
consumes a result or serves a step, so the command is safe to point at a live fleet.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Annotated

import typer

from durably._cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    AppOpt,
    Args,
    CliError,
    JsonOpt,
    StoreOpt,
    check_store_url,
    default_store,
    dispatch,
    echo,
    exclusive,
    load_app,
    print_json,
)
from durably._cli.render import format_duration, table
from durably._core.handshake import AnnouncedWorkflow, routes_to_json
from durably._engine.engine import Engine
from durably._read.list_models import (
    GroupHealth,
    WorkerDescription,
    WorkerHeartbeat,
    WorkflowDirectory,
)
from durably._store.protocol import StateStore
from durably._transport.protocol import Transport

__all__ = ["InstanceView", "directory_lines", "group_lines", "instances_of", "register"]

# How many names of a list (steps, capabilities, …) a line shows before it says "+N more".
_NAMES_SHOWN = 12


def register(runs: typer.Typer) -> None:
    @runs.command(
        "workers",
        short_help="worker health: groups, live workers, announced workflows",
        help=(
            "Worker groups and their health: from the store, one runs@<namespace> group with "
            "its backlog and the engines holding run leases; with --transport, one group per "
            "routing token of that broker with its queue depth and the workers beating on it "
            "(runtime, SDK, steps and workflows served, capabilities, in flight / limit, last "
            "beat), then the workflows those workers announce and where they disagree. Reads "
            "only: nothing is consumed or served."
        ),
    )
    def _workers_cmd(
        store: StoreOpt = None,
        app: AppOpt = None,
        json: JsonOpt = False,
        transport: Annotated[
            str | None,
            typer.Option(
                "--transport",
                metavar="URL",
                help="also read the live workers this broker reports (redis://…)",
            ),
        ] = None,
        prefix: Annotated[
            str | None,
            typer.Option(
                "--prefix",
                metavar="P",
                help="the Redis transport's key prefix, namespace folded in (default: durable)",
            ),
        ] = None,
    ) -> None:
        dispatch(_handler, store=store, app=app, json=json, transport=transport, prefix=prefix)


def _handler(args: Args) -> int:
    exclusive(**{"--store": args.store, "--app": args.app})
    if args.prefix is not None and args.transport is None:
        raise CliError("--prefix needs --transport URL", EXIT_USAGE)
    return asyncio.run(_run(args))


def _transport(url: str, prefix: str | None, instance_id: str) -> Transport | str:
    """The URL itself (the engine builds the transport with default settings), or with
    `--prefix` the Redis transport on that prefix."""
    if prefix is None:
        return url
    if url.split("://", 1)[0].lower() not in ("redis", "rediss"):
        raise CliError("--prefix applies to a redis:// transport only", EXIT_USAGE)
    # Imported here: the Redis packages are an optional extra, needed only when asked for.
    from durably.transports import RedisTransport

    return RedisTransport(url, prefix=prefix, instance_id=instance_id)


@asynccontextmanager
async def _engine(args: Args) -> AsyncIterator[Engine]:
    """A drive=False engine on the `--store`/`--app` store with the `--transport` given.
    `role="worker"` with drive=False: an observer, which takes none of the fleet's step
    results and turn decisions (a read must never consume them) and serves no step."""
    instance_id = f"durably-cli-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    transport = None
    if args.transport is not None:
        transport = _transport(args.transport, args.prefix, instance_id)
    app = load_app(args.app) if args.app is not None else None
    try:
        store: StateStore | str
        if app is not None:
            store, namespace, options = app.store, app.namespace, app.options
        else:
            store, namespace, options = args.store or default_store(), "default", None
            check_store_url(store, must_exist=True)
        try:
            engine = Engine(
                store,
                transport,
                workflows=[],
                drive=False,
                role="worker" if transport is not None else None,
                namespace=namespace,
                instance_id=instance_id,
                options=options,
            )
        except ValueError as exc:  # a transport URL of an unknown scheme
            raise CliError(str(exc), EXIT_USAGE) from None
        async with engine:
            yield engine
    finally:
        if app is not None:
            await app.close()  # never opened: just closes the store it owns


async def _run(args: Args) -> int:
    async with _engine(args) as engine:
        groups = await engine.worker_health()
        directory = await engine.workflow_directory()
        now = engine.clock()
    if args.json:
        print_json({"groups": [g.to_json() for g in groups], "directory": directory.to_json()})
        return EXIT_OK
    for line in group_lines(groups, now):
        echo(line)
    echo()
    for line in directory_lines(directory):
        echo(line)
    return EXIT_OK


# ------------------------------------------------------------------ rendering


def _names(values: Sequence[str]) -> str:
    if not values:
        return "—"
    shown = ", ".join(values[:_NAMES_SHOWN])
    more = len(values) - _NAMES_SHOWN
    return shown + (f", +{more} more" if more > 0 else "")


def _ago(at_ms: int, now_ms: int) -> str:
    if at_ms <= 0:
        return "unknown"
    return format_duration(max(0, now_ms - at_ms)) + " ago"


@dataclass
class InstanceView:
    """One live worker across the groups it serves: its latest beat (a worker reports the
    same load on every token it beats on, so the newest report is the one shown)."""

    instance_id: str
    transport: str | None
    latest: WorkerHeartbeat
    groups: list[str] = field(default_factory=list)

    @property
    def description(self) -> WorkerDescription | None:
        return self.latest.descriptor


def instances_of(groups: Sequence[GroupHealth]) -> list[InstanceView]:
    """Every live worker once (per transport), with the groups it beats on."""
    seen: dict[tuple[str | None, str], InstanceView] = {}
    for g in groups:
        for w in g.live_workers:
            key = (g.transport, w.instance_id)
            view = seen.get(key)
            if view is None:
                view = seen[key] = InstanceView(w.instance_id, g.transport, w)
            elif w.last_beat_at > view.latest.last_beat_at or (
                view.latest.descriptor is None and w.descriptor is not None
            ):
                view.latest = w
            view.groups.append(g.group)
    return sorted(seen.values(), key=lambda v: (v.transport or "", v.instance_id))


def group_lines(groups: Sequence[GroupHealth], now_ms: int) -> list[str]:
    """The groups as a table, then each live worker with what it serves."""
    if not groups:
        return ["No worker groups."]
    rows = [
        [
            g.group,
            g.kind or "—",
            g.transport or "(store)",
            str(g.depth),
            str(len(g.live_workers)),
            "backlog, no workers" if g.alert else "",
        ]
        for g in groups
    ]
    lines = table(["GROUP", "KIND", "FROM", "DEPTH", "WORKERS", ""], rows, right=(3, 4))
    instances = instances_of(groups)
    lines += ["", f"Live workers ({len(instances)}):" if instances else "No live workers."]
    for view in instances:
        lines += _instance_lines(view, now_ms)
    return lines


def _instance_lines(view: InstanceView, now_ms: int) -> list[str]:
    status, d = view.latest.status, view.description
    facts = []
    runtime = d.runtime if d is not None else status.runtime if status is not None else None
    if runtime:
        facts.append(runtime)
    if d is not None:
        facts.append(f"{d.sdk} {d.sdk_version}")
    if status is not None:
        c = status.concurrency
        limit = f"{c.limit}" + (f" ({c.mode} {c.min}–{c.max})" if c.mode == "adaptive" else "")
        facts.append(f"in flight {status.in_flight}/{limit}")
    facts.append(f"beat {_ago(view.latest.last_beat_at, now_ms)}")
    if view.transport is not None:
        facts.append(f"transport {view.transport}")
    lines = [
        f"  {view.instance_id}  " + " · ".join(facts),
        f"    groups:       {_names(view.groups)}",
    ]
    if d is not None:
        lines += [
            f"    steps:        {_names(d.steps)}",
            f"    workflows:    {_names(d.workflows)}",
            f"    capabilities: {_names(d.capabilities)}",
        ]
        if d.partition or d.namespace:
            where = [f"partition {d.partition}"] if d.partition else []
            where += [f"namespace {d.namespace}"] if d.namespace else []
            lines.append(f"    serves:       {', '.join(where)}")
    return lines


def _routes(w: AnnouncedWorkflow) -> str:
    if not w.on_error:
        return "—"
    return " | ".join(
        ", ".join(f"{r.get('code', '*')} → {r['workflow']}" for r in routes_to_json(s)) or "none"
        for s in w.on_error
    )


def directory_lines(directory: WorkflowDirectory) -> list[str]:
    """The announced workflows, their onError routes and every disagreement."""
    lines = ["Announced workflows:" if directory.workflows else "Announced workflows: none."]
    if directory.workflows:
        rows = [
            [
                w.key,
                w.evidence,
                _names(w.groups),
                str(len(w.instances)),
                _routes(w),
            ]
            for w in directory.workflows
        ]
        lines += [
            "  " + line
            for line in table(
                ["WORKFLOW", "EVIDENCE", "GROUPS", "WORKERS", "ONERROR"], rows, right=(3,)
            )
        ]
    for w in directory.disagreements:
        for d in w.disagreements:
            lines.append(f"  ! {w.key}: the workers disagree on {d.axis}: {' | '.join(d.values)}")
    if directory.detail:
        lines.append(directory.detail)
    return lines
