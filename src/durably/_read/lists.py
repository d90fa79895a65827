"""Run lists, wait descriptors, facets and worker health (run-detail.md §2–§6).

Pure functions over a store (and, for worker health, an engine) that the Engine's read API
and the store gateway call. Every optional store method has the spec's fallback
(store.md §4): `run_facets` → `merge_run_facet_rows` over a full `list_runs`;
`run_value_facets` → `[]`; `count_runs` → `len(list_runs(...))`; `lease_owners` → a scan of
the live runs' lease columns.

The merge helpers (`merge_run_facet_rows`, `merge_run_value_facet_rows`) are the single
normalisation every store pipes its raw rows through, so the in-memory reference, SQLite and
PostgreSQL return identical lists.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, cast

from durably._core.models import (
    UNSET,
    AttributeFilter,
    RunQuery,
    RunStatus,
    SignalWaiter,
    WorkflowRun,
)
from durably._read.list_models import (
    COLUMN_AXES,
    GroupHealth,
    LeaseOwnerRow,
    RunFacetRow,
    RunListItem,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    RunWaiting,
    WorkerConcurrency,
    WorkerHeartbeat,
    WorkerStatus,
)

__all__ = [
    "BACKLOG_STATUSES",
    "LEASED_STATUSES",
    "RUNS_GROUP",
    "as_run_query",
    "axis_is_run_column",
    "classify_waiter_token",
    "count_runs",
    "event_name_of",
    "facet_origin",
    "facet_query",
    "index_waiters_by_run",
    "js_string",
    "lease_owners",
    "lease_owners_from_runs",
    "list_run_items",
    "merge_run_facet_rows",
    "merge_run_value_facet_rows",
    "resolve_run_waiting",
    "run_facets",
    "run_facets_from_runs",
    "run_value_facets",
    "run_value_facets_from_runs",
    "stamp_waiting",
    "unpaged",
    "values_of",
    "waiting_for",
    "worker_health",
]


# ================================================================ queries


_QUERY_FIELDS = {f.name for f in dataclasses.fields(RunQuery)}


def _attribute_filter(value: AttributeFilter | Mapping[str, Any]) -> AttributeFilter:
    if isinstance(value, AttributeFilter):
        return value
    values = value.get("values")
    return AttributeFilter(
        key=str(value["key"]),
        op=value["op"],
        value=value.get("value"),
        values=tuple(values) if values is not None else None,
    )


def as_run_query(query: RunQuery | Mapping[str, Any] | None = None, **kwargs: Any) -> RunQuery:
    """A `RunQuery` from a `RunQuery`, a mapping (the JSON form: its keys are the same words),
    and/or keyword arguments (`engine.list_runs(status='running', limit=10)`); keywords win.
    `origin` absent stays `UNSET` (no restriction); `origin=None` means IS NULL. Attribute
    filters may be `AttributeFilter`s or `{key, op, value|values}` mappings. Unknown keys
    raise `TypeError`."""
    base = query if isinstance(query, RunQuery) else RunQuery()
    changes: dict[str, Any] = {}
    if isinstance(query, Mapping):
        changes.update(query)
    changes.update(kwargs)
    unknown = set(changes) - _QUERY_FIELDS
    if unknown:
        raise TypeError(f"unknown run query field(s): {', '.join(sorted(unknown))}")
    if changes.get("attributes") is not None:
        changes["attributes"] = tuple(_attribute_filter(a) for a in changes["attributes"])
    for plural in ("workflows", "statuses", "tags", "namespaces", "origins"):
        if changes.get(plural) is not None:
            changes[plural] = tuple(changes[plural])
    return dataclasses.replace(base, **changes) if changes else base


def unpaged(query: RunQuery) -> RunQuery:
    """`query` without `limit`/`offset` (counts and facets are whole-set)."""
    if query.limit is None and query.offset is None:
        return query
    return dataclasses.replace(query, limit=None, offset=None)


def facet_query(query: RunQuery) -> RunQuery:
    """`RunFacetQuery` (store.md §6): drop `status`, `statuses`, `origin`, `origins` (the two
    axes being counted) and the page window."""
    return dataclasses.replace(
        query, status=None, statuses=None, origin=UNSET, origins=None, limit=None, offset=None
    )


# ================================================================ §2 waiting


def event_name_of(token: str) -> str:
    """The event name of an `event:<b64 name>:…` token; the raw token when the second
    segment is missing or is not base64 of UTF-8."""
    parts = token.split(":")
    if len(parts) < 2:
        return token
    try:
        return base64.b64decode(parts[1], validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return token


def classify_waiter_token(token: str) -> RunWaiting:
    """run-detail.md §2, first match wins."""
    if token.startswith("wh:"):
        return RunWaiting(on="webhook", name=token)
    if token.startswith("bp:"):
        return RunWaiting(on="breakpoint", name="breakpoint")
    if token.startswith("child:"):
        return RunWaiting(on="child", name=token[len("child:") :])
    if token.startswith("event:"):
        return RunWaiting(on="signal", name=event_name_of(token))
    return RunWaiting(on="signal", name=token)


def index_waiters_by_run(waiters: Iterable[SignalWaiter]) -> dict[str, SignalWaiter]:
    """run_id → the first waiter seen in the given order (store order is `(run_id, seq)`)."""
    out: dict[str, SignalWaiter] = {}
    for waiter in waiters:
        out.setdefault(waiter.run_id, waiter)
    return out


def resolve_run_waiting(
    run: WorkflowRun, waiter_by_run: Mapping[str, SignalWaiter]
) -> RunWaiting | None:
    """None unless the run is suspended AND has a waiter (a bare sleep, an in-flight remote
    step or a reconcile-parked orphan is deliberately not guessed)."""
    if run.status != "suspended":
        return None
    waiter = waiter_by_run.get(run.id)
    return classify_waiter_token(waiter.token) if waiter is not None else None


def stamp_waiting(
    runs: Iterable[WorkflowRun], waiters: Iterable[SignalWaiter]
) -> list[RunListItem]:
    index = index_waiters_by_run(waiters)
    return [RunListItem(run=run, waiting=resolve_run_waiting(run, index)) for run in runs]


async def list_run_items(store: Any, query: RunQuery) -> list[RunListItem]:
    """Store gateway `list_runs` (run-detail.md §2): `store.list_runs(query)`, then ONE bulk
    `list_signal_waiters('')` (skipped when no listed run is suspended), stamped."""
    runs: list[WorkflowRun] = await store.list_runs(query)
    if not any(r.status == "suspended" for r in runs):
        return [RunListItem(run=r) for r in runs]
    waiters: list[SignalWaiter] = await store.list_signal_waiters("")
    return stamp_waiting(runs, waiters)


async def waiting_for(store: Any, run_ids: Iterable[str]) -> dict[str, RunWaiting]:
    """run-detail.md §3: entries only for requested runs that are suspended on an
    event-type waiter right now. `[]` → `{}` without touching the store."""
    wanted = set(run_ids)
    if not wanted:
        return {}
    suspended, waiters = await asyncio.gather(
        store.list_runs(RunQuery(statuses=("suspended",))),
        store.list_signal_waiters(""),
    )
    index = index_waiters_by_run(waiters)
    out: dict[str, RunWaiting] = {}
    for run in cast(list[WorkflowRun], suspended):
        if run.id in wanted:
            waiting = resolve_run_waiting(run, index)
            if waiting is not None:
                out[run.id] = waiting
    return out


async def count_runs(store: Any, query: RunQuery) -> int:
    """`store.count_runs` (page ignored), else `len(list_runs(query without paging))`."""
    counter = getattr(store, "count_runs", None)
    if counter is not None:
        return int(await counter(unpaged(query)))
    return len(await store.list_runs(unpaged(query)))


# ================================================================ §4 run facets


def facet_origin(origin: object) -> str | None:
    """`origin` unchanged when a string with non-blank content, else None."""
    if isinstance(origin, str) and origin.strip():
        return origin
    return None


def merge_run_facet_rows(
    rows: Iterable[RunFacetRow | tuple[str, str | None, int]],
) -> list[RunFacetRow]:
    """One cell per `(status, facet_origin(origin))`, counts summed, first-seen order;
    non-positive cells dropped."""
    cells: dict[tuple[str, str | None], int] = {}
    for row in rows:
        if isinstance(row, RunFacetRow):
            row = (row.status, row.origin, row.count)
        status, origin, count = row
        key = (str(status), facet_origin(origin))
        cells[key] = cells.get(key, 0) + int(count)
    return [
        RunFacetRow(status=cast(RunStatus, status), origin=origin, count=count)
        for (status, origin), count in cells.items()
        if count > 0
    ]


def run_facets_from_runs(runs: Iterable[WorkflowRun]) -> list[RunFacetRow]:
    """The gateway fallback: one `(status, origin, 1)` cell per run, merged."""
    return merge_run_facet_rows((r.status, r.origin, 1) for r in runs)


async def run_facets(store: Any, query: RunQuery) -> list[RunFacetRow]:
    """`store.run_facets(facet_query(query))`, else `merge_run_facet_rows` over a full
    `store.list_runs(facet_query(query))` (store.md §4). Whole-set exact, never paged."""
    q = facet_query(query)
    method = getattr(store, "run_facets", None)
    if method is not None:
        return merge_run_facet_rows(await method(q))
    return run_facets_from_runs(await store.list_runs(q))


# ================================================================ §5 value facets


def js_string(value: object) -> str:
    """JS `String(v)` for a search-attribute value: `True` → 'true', `200.0` → '200',
    `1e21` → '1e+21', `1e-7` → '1e-7', strings unchanged."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        if value == 0:
            return "0"
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        text = repr(value)
        if "e" not in text:
            return text
        if 1e-6 <= abs(value) < 1e21:  # JS writes these positionally
            return format(Decimal(text), "f")
        mantissa, exp = text.split("e")
        sign = "-" if exp.startswith("-") else "+"
        digits = exp.lstrip("+-").lstrip("0") or "0"
        return f"{mantissa.removesuffix('.0')}e{sign}{digits}"
        return text
    return str(value)


def axis_is_run_column(axis: RunValueAxis | Mapping[str, Any] | str) -> bool:
    """True for the `workflow`, `status`, `origin` and `namespace` axes."""
    return RunValueAxis.of(axis).field in COLUMN_AXES


def values_of(run: WorkflowRun, axis: RunValueAxis) -> list[str | None]:
    """The values one run contributes to `axis` (run-detail.md §5); tags count once per run."""
    f = axis.field
    if f == "workflow":
        return [run.workflow]
    if f == "status":
        return [run.status]
    if f == "origin":
        return [facet_origin(run.origin)]
    if f == "namespace":
        return [run.namespace or "default"]
    if f == "tag":
        return list(dict.fromkeys(run.tags or ()))
    attrs = run.search_attributes or {}
    if f == "attributeKey":
        return list(attrs)
    if axis.key is not None and axis.key in attrs:
        return [js_string(attrs[axis.key])]
    return []


def _value_sort_key(row: RunValueFacetRow) -> tuple[int, int, str]:
    return (-row.count, 1 if row.value is None else 0, row.value or "")


def merge_run_value_facet_rows(
    rows: Iterable[RunValueFacetRow | tuple[str | None, int]],
    opts: RunValueFacetOptions | Mapping[str, Any] | None = None,
) -> list[RunValueFacetRow]:
    """Sum per value (None/missing → None), drop non-positive counts, order by count DESC then
    value by code point with None last among equals, keep the first `limit` (100)."""
    sums: dict[str | None, int] = {}
    for row in rows:
        if isinstance(row, RunValueFacetRow):
            value, count = row.value, row.count
        else:
            value, count = row
        key = value if isinstance(value, str) else None
        sums[key] = sums.get(key, 0) + int(count)
    merged = [RunValueFacetRow(value=v, count=c) for v, c in sums.items() if c > 0]
    merged.sort(key=_value_sort_key)
    return merged[: RunValueFacetOptions.of(opts).effective_limit]


def run_value_facets_from_runs(
    runs: Iterable[WorkflowRun],
    axis: RunValueAxis | Mapping[str, Any] | str,
    opts: RunValueFacetOptions | Mapping[str, Any] | None = None,
) -> list[RunValueFacetRow]:
    """`runs` already filtered, newest first and cut to the scan window: one `(value, 1)` row
    per contributed value, merged."""
    ax = RunValueAxis.of(axis)
    return merge_run_value_facet_rows(
        ((v, 1) for run in runs for v in values_of(run, ax)), RunValueFacetOptions.of(opts)
    )


async def run_value_facets(
    store: Any,
    axis: RunValueAxis | Mapping[str, Any] | str,
    query: RunQuery,
    opts: RunValueFacetOptions | Mapping[str, Any] | None = None,
) -> list[RunValueFacetRow]:
    """`store.run_value_facets(axis, query without page, opts)` re-merged (so `limit` holds
    whatever the store did), else `[]` — the picker falls back to free text (store.md §4)."""
    method = getattr(store, "run_value_facets", None)
    if method is None:
        return []
    ax = RunValueAxis.of(axis)
    options = RunValueFacetOptions.of(opts)
    return merge_run_value_facet_rows(await method(ax, unpaged(query), options), options)


# ================================================================ §6 worker health

#: Base token of the synthesised per-namespace group of in-process workers (`runs@<ns>`).
RUNS_GROUP = "runs"
#: Run statuses that make up a group's `depth` (waiting + active).
BACKLOG_STATUSES: tuple[RunStatus, ...] = ("pending", "running")
#: Statuses whose lease columns can be live (the fallback scan of `lease_owners`).
LEASED_STATUSES: tuple[RunStatus, ...] = ("pending", "running", "suspended", "cancelling")


def lease_owners_from_runs(
    runs: Iterable[WorkflowRun], now_ms: int, namespace: str | None = None
) -> list[LeaseOwnerRow]:
    """The in-process reference of `store.lease_owners`: unexpired leases grouped by
    `(namespace, owner)`, ordered by namespace then owner."""
    cells: dict[tuple[str, str], tuple[int, int]] = {}
    for run in runs:
        if run.locked_by is None or run.locked_until is None or run.locked_until <= now_ms:
            continue
        ns = run.namespace or "default"
        if namespace is not None and ns != namespace:
            continue
        n, until = cells.get((ns, run.locked_by), (0, 0))
        cells[(ns, run.locked_by)] = (n + 1, max(until, run.locked_until))
    return [
        LeaseOwnerRow(namespace=ns, owner=owner, runs=n, lease_until=until)
        for (ns, owner), (n, until) in sorted(cells.items())
    ]


async def lease_owners(
    store: Any, now_ms: int, namespace: str | None = None
) -> list[LeaseOwnerRow]:
    """`store.lease_owners(now_ms, namespace)` (one GROUP BY), else a scan of the runs in
    `LEASED_STATUSES`."""
    method = getattr(store, "lease_owners", None)
    if method is not None:
        return list(await method(now_ms, namespace))
    runs = await store.list_runs(RunQuery(statuses=LEASED_STATUSES, namespace=namespace))
    return lease_owners_from_runs(runs, now_ms, namespace)


async def _backlog_by_namespace(store: Any, namespace: str | None) -> dict[str, int]:
    query = RunQuery(statuses=BACKLOG_STATUSES, namespace=namespace)
    rows = await run_value_facets(
        store, RunValueAxis(field="namespace"), query, RunValueFacetOptions(limit=10_000)
    )
    if not rows and getattr(store, "run_value_facets", None) is None:
        runs = await store.list_runs(query)
        rows = run_value_facets_from_runs(
            runs, RunValueAxis(field="namespace"), RunValueFacetOptions(limit=10_000)
        )
    return {r.value: r.count for r in rows if r.value is not None}


def _self_status(engine: Any) -> WorkerStatus:
    limit = getattr(engine, "max_concurrent_runs", 0) or 0
    executions = getattr(engine, "executions", None) or {}
    return WorkerStatus(
        runtime="python",
        concurrency=WorkerConcurrency(mode="fixed", limit=int(limit)),
        in_flight=len(executions),
    )


async def _transport_health(
    transport: Any, groups: Sequence[str], workflow_tokens: set[str]
) -> list[GroupHealth]:
    """run-detail.md §6 steps 1–3 over a transport that can introspect groups."""
    listed = getattr(transport, "list_worker_groups", None)
    names = list(dict.fromkeys([*groups, *((await listed()) if listed else ())]))
    out: list[GroupHealth] = []
    for group in names:
        health = await transport.group_health(group)
        if not health:
            continue
        if isinstance(health, Mapping):
            health = GroupHealth.from_json(health)
        base = group.rsplit("@", 1)[0] if "@" in group else group
        kind: Any = "workflow" if base in workflow_tokens else "step"
        out.append(dataclasses.replace(cast(GroupHealth, health), group=group, kind=kind))
    return out


async def worker_health(
    source: Any,
    *,
    extra: Sequence[str] = (),
    now_ms: int | None = None,
    namespace: Any = UNSET,
    lease_ms: int | None = None,
) -> list[GroupHealth]:
    """`engine.worker_health()` (run-detail.md §6) for an Engine or a bare store.

    A transport with `group_health` (remote workers beating into it) answers the spec's
    algorithm: groups = `extra` ∪ `transport.list_worker_groups()`, one `group_health` each,
    `kind` from the workflow tokens. Otherwise — the in-process transport, which has no
    heartbeats — health is derived from what the store holds (durably):

    - one group `runs@<namespace>` (kind `workflow`) per namespace with backlog or leases,
      plus the engine's own namespace (`namespace=None` = every namespace);
    - `depth` = runs `pending` + `running` in that namespace (one `GROUP BY`);
    - `liveWorkers` = every owner of an unexpired run lease (one `GROUP BY namespace,
      locked_by`), `lastBeatAt` = its latest `lockedUntil - lease_ms` (the last renewal);
      the calling engine (when it drives runs) always appears with `lastBeatAt = now` and a
      `status` (fixed concurrency `max_concurrent_runs`, `inFlight` = its executions).

    Left out: engines that hold no lease (idle workers of other processes) are invisible
    without a heartbeat table; `status` of other instances is unknown; delayed (timer) runs
    are not counted in `depth`.
    """
    engine = source if hasattr(source, "store") else None
    store = engine.store if engine is not None else source
    transport = getattr(engine, "transport", None) if engine is not None else None
    if transport is not None and callable(getattr(transport, "group_health", None)):
        tokens: set[str] = set(getattr(engine, "workflow_tokens", lambda: set())())
        return await _transport_health(transport, list(extra), tokens)

    if now_ms is None:
        clock = getattr(engine, "clock", None)
        now_ms = int(clock()) if clock is not None else int(time.time() * 1000)
    if namespace is UNSET:
        namespace = getattr(engine, "namespace", None) if engine is not None else None
    if lease_ms is None:
        lease_ms = int(getattr(engine, "lease_ms", 0) or 0)

    backlog, owners = await asyncio.gather(
        _backlog_by_namespace(store, namespace), lease_owners(store, now_ms, namespace)
    )
    names: list[str] = []
    if engine is not None and getattr(engine, "drive_runs", True) and namespace is not None:
        names.append(namespace)
    names.extend(sorted(set(backlog) | {o.namespace for o in owners}))
    names = list(dict.fromkeys(names))

    self_id = getattr(engine, "instance_id", None) if engine is not None else None
    drives = engine is not None and getattr(engine, "drive_runs", True)
    out: list[GroupHealth] = []
    for ns in names:
        group = f"{RUNS_GROUP}@{ns}"
        workers: dict[str, WorkerHeartbeat] = {}
        if drives and self_id is not None and (namespace is None or ns == namespace):
            workers[self_id] = WorkerHeartbeat(
                group=group,
                instance_id=self_id,
                last_beat_at=now_ms,
                status=_self_status(engine),
            )
        for row in owners:
            if row.namespace != ns or row.owner in workers:
                continue
            workers[row.owner] = WorkerHeartbeat(
                group=group,
                instance_id=row.owner,
                last_beat_at=min(now_ms, row.lease_until - lease_ms),
            )
        out.append(
            GroupHealth(
                group=group,
                depth=backlog.get(ns, 0),
                live_workers=tuple(workers.values()),
                kind="workflow",
            )
        )
    return out
