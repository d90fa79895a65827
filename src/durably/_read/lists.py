"""Run lists, wait descriptors, facets and worker health over a store.

Functions the Engine's read API calls. Every count is answered by the store itself (one
`GROUP BY` on the SQL stores); the rows are re-merged here (`merge_run_facet_rows`,
`merge_run_value_facet_rows` from `durably._core.run_facets`) so a limit holds whatever the
store did. Worker health here is what the store can tell (the run leases); the engine adds
the groups its transports report (`durably._read.fleet`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from durably._core.models import (
    AttributeFilter,
    RunQuery,
    RunStatus,
    SignalWaiter,
    WorkflowRun,
)
from durably._core.run_activity import ActivityBucket, ActivityWindow
from durably._core.run_facets import (
    LeaseOwnerRow,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    axis_is_run_column,
    facet_origin,
    facet_query,
    js_string,
    lease_owners_from_runs,
    merge_run_facet_rows,
    merge_run_value_facet_rows,
    run_facets_from_runs,
    run_value_facets_from_runs,
    unpaged,
    values_of,
)
from durably._read.beats import step_waits, unserved_waiting
from durably._read.list_models import (
    GroupHealth,
    RunListItem,
    RunWaiting,
    WorkerConcurrency,
    WorkerHeartbeat,
    WorkerStatus,
)
from durably._read.stores import RunListStore
from durably._store.protocol import ReadStore

__all__ = [
    "BACKLOG_STATUSES",
    "RUNS_GROUP",
    "LocalWorker",
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
    "run_activity",
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


# ================================================================ waiting


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
    """What a waiter token says the run waits on; the first matching prefix wins."""
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
    """A run parked because no worker serves its workflow: `worker` (from its row). Else
    None unless the run is suspended AND has a waiter (a bare sleep, an in-flight remote
    step or a reconcile-parked orphan is deliberately not guessed; a remote step no worker
    consumes is found by `beats.step_waits`)."""
    parked = unserved_waiting(run)
    if parked is not None:
        return parked
    if run.status != "suspended":
        return None
    waiter = waiter_by_run.get(run.id)
    return classify_waiter_token(waiter.token) if waiter is not None else None


def stamp_waiting(
    runs: Iterable[WorkflowRun], waiters: Iterable[SignalWaiter]
) -> list[RunListItem]:
    index = index_waiters_by_run(waiters)
    return [RunListItem(run=run, waiting=resolve_run_waiting(run, index)) for run in runs]


async def list_run_items(store: RunListStore, query: RunQuery) -> list[RunListItem]:
    """The run list with what each run waits on: `store.list_runs(query)`, then ONE bulk
    `list_signal_waiters('')` (skipped when no listed run is suspended), stamped; the
    suspended runs left without a wait are looked at for a remote step no worker consumes
    (`beats.step_waits`, bounded)."""
    runs: list[WorkflowRun] = await store.list_runs(query)
    if not any(r.status == "suspended" for r in runs):
        return [RunListItem(run=r, waiting=unserved_waiting(r)) for r in runs]
    waiters: list[SignalWaiter] = await store.list_signal_waiters("")
    items = stamp_waiting(runs, waiters)
    steps = await step_waits(store, [i.run for i in items if i.waiting is None])
    if not steps:
        return items
    return [
        RunListItem(run=i.run, waiting=steps[i.run.id]) if i.run.id in steps else i for i in items
    ]


async def waiting_for(store: RunListStore, run_ids: Iterable[str]) -> dict[str, RunWaiting]:
    """What each requested run waits on: entries only for runs that wait right now — on an
    event-type waiter (suspended), on a worker for its workflow (parked `blocked`), or on a
    remote step no live worker consumes (suspended). `[]` → `{}` without touching the
    store."""
    wanted = set(run_ids)
    if not wanted:
        return {}
    waiting_runs, waiters = await asyncio.gather(
        store.list_runs(RunQuery(statuses=("suspended", "blocked"))),
        store.list_signal_waiters(""),
    )
    index = index_waiters_by_run(waiters)
    out: dict[str, RunWaiting] = {}
    unexplained: list[WorkflowRun] = []
    for run in waiting_runs:
        if run.id in wanted:
            waiting = resolve_run_waiting(run, index)
            if waiting is not None:
                out[run.id] = waiting
            elif run.status == "suspended":
                unexplained.append(run)
    out.update(await step_waits(store, unexplained))
    return out


async def count_runs(store: ReadStore, query: RunQuery) -> int:
    """How many runs match `query`, its page ignored."""
    return int(await store.count_runs(unpaged(query)))


# ================================================================ facets


async def run_facets(store: ReadStore, query: RunQuery) -> list[RunFacetRow]:
    """Run counts by `(status, origin)` over every run matching `query` with its status and
    origin filters and its page dropped (`facet_query`)."""
    return merge_run_facet_rows(await store.run_facets(facet_query(query)))


async def run_activity(
    store: ReadStore, window: ActivityWindow, query: RunQuery
) -> list[ActivityBucket]:
    """Runs started / completed / failed per bucket of `window` among the runs matching
    `query`, its page ignored (`durably._core.run_activity`)."""
    return await store.run_activity(unpaged(query), window)


async def run_value_facets(
    store: ReadStore,
    axis: RunValueAxis | Mapping[str, Any] | str,
    query: RunQuery,
    opts: RunValueFacetOptions | Mapping[str, Any] | None = None,
) -> list[RunValueFacetRow]:
    """`store.run_value_facets(axis, query without page, opts)` re-merged, so `limit` holds
    whatever the store did."""
    ax = RunValueAxis.of(axis)
    options = RunValueFacetOptions.of(opts)
    rows = await store.run_value_facets(ax, unpaged(query), options)
    return merge_run_value_facet_rows(rows, options)


async def lease_owners(
    store: ReadStore, now_ms: int, namespace: str | None = None
) -> list[LeaseOwnerRow]:
    """Unexpired run leases grouped by `(namespace, owner)` (one `GROUP BY`)."""
    return list(await store.lease_owners(now_ms, namespace))


# ================================================================ worker health

#: Base token of the synthesised per-namespace group of in-process workers (`runs@<ns>`).
RUNS_GROUP = "runs"
#: Run statuses that make up a group's `depth` (waiting + active).
BACKLOG_STATUSES: tuple[RunStatus, ...] = ("pending", "running")


@dataclass(frozen=True, slots=True)
class LocalWorker:
    """The asking engine, when it drives runs: listed alive in its namespace's group even
    while it holds no lease, with its own status (a fixed concurrency `limit`, the turns
    `in_flight` now) — or, under a worker concurrency limit, that limit's `steps` status."""

    instance_id: str
    limit: int
    in_flight: int
    steps: WorkerStatus | None = None

    def status(self) -> WorkerStatus:
        if self.steps is not None:
            return self.steps
        return WorkerStatus(
            runtime="python",
            concurrency=WorkerConcurrency(mode="fixed", limit=self.limit),
            in_flight=self.in_flight,
        )


async def _backlog_by_namespace(store: ReadStore, namespace: str | None) -> dict[str, int]:
    query = RunQuery(statuses=BACKLOG_STATUSES, namespace=namespace)
    rows = await run_value_facets(
        store, RunValueAxis(field="namespace"), query, RunValueFacetOptions(limit=10_000)
    )
    return {r.value: r.count for r in rows if r.value is not None}


async def worker_health(
    store: ReadStore,
    *,
    now_ms: int,
    lease_ms: int,
    namespace: str | None = None,
    local: LocalWorker | None = None,
) -> list[GroupHealth]:
    """Worker groups and their health, derived from what the store holds (the in-process
    transport has no heartbeats):

    - one group `runs@<namespace>` (kind `workflow`) per namespace with backlog or leases,
      plus `namespace` itself when a `local` worker drives runs there (`namespace=None` =
      every namespace);
    - `depth` = runs `pending` + `running` in that namespace (one `GROUP BY`);
    - `liveWorkers` = every owner of an unexpired run lease (one `GROUP BY namespace,
      locked_by`), `lastBeatAt` = its latest `lockedUntil - lease_ms` (the last renewal);
      the `local` worker always appears with `lastBeatAt = now_ms` and its status.

    Left out: engines that hold no lease (idle workers of other processes) are invisible
    without a heartbeat table; the status of other instances is unknown; delayed (timer)
    runs are not counted in `depth`.
    """
    backlog, owners = await asyncio.gather(
        _backlog_by_namespace(store, namespace), lease_owners(store, now_ms, namespace)
    )
    names: list[str] = []
    if local is not None and namespace is not None:
        names.append(namespace)
    names.extend(sorted(set(backlog) | {o.namespace for o in owners}))
    names = list(dict.fromkeys(names))

    out: list[GroupHealth] = []
    for ns in names:
        group = f"{RUNS_GROUP}@{ns}"
        workers: dict[str, WorkerHeartbeat] = {}
        if local is not None and (namespace is None or ns == namespace):
            workers[local.instance_id] = WorkerHeartbeat(
                group=group,
                instance_id=local.instance_id,
                last_beat_at=now_ms,
                status=local.status(),
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
