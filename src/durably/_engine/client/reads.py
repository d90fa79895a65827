"""The reads behind the public read methods of `Client` and `Engine`: runs, run detail, fan
pages, facets, and the health of the fleet.

`RunReads` needs nothing but the store, so a `Client` in a process without any workflow code
answers exactly what an `Engine` does (an engine answers through its client).
`get_run_detail` and `get_fan_members` answer through the store-backed gateway functions
(`durably._read.gateway`), so an aggregating store (every first-party store) summarises wide
fans from a `GROUP BY` plus a bounded number of rows, and a matching `if_none_match` answers
not-modified without reading the timeline.
`WorkerHealth` (the health of worker groups, this engine included, and the workflow
directory of the live workers) is the engine's alone: only an engine has transports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from durably._core.log_context import durably_logger
from durably._core.models import RunQuery, StepCheckpoint, WorkflowRun
from durably._core.run_activity import ActivityBucket, ActivityWindow
from durably._engine.control.operator import get_run_children
from durably._engine.defs.remote_workflows import RemoteWorkflow
from durably._read import fleet, lists
from durably._read.gateway import store_fan_members, store_run_detail
from durably._read.history import read_history
from durably._read.list_models import (
    GroupHealth,
    RunFacetRow,
    RunListItem,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    RunWaiting,
    WorkflowDirectory,
)
from durably._read.models import FanPage, FanPageQuery, RunDetail, RunDetailOptions
from durably._read.vocabulary import FAN_PAGE_DEFAULT_LIMIT

if TYPE_CHECKING:
    from durably._engine.defs.registry import Workflow
    from durably._store.protocol import StateStore
    from durably._transport.protocol import WorkerDirectory

__all__ = ["RunReads", "WorkerHealth", "read_fleet"]

log = durably_logger("durably.engine")

# Queue depths are read this many tokens at a time: enough to answer a large fleet within one
# console refresh, few enough not to crowd the broker connection the engine dispatches on.
_DEPTH_READS_AT_ONCE = 32


class RunReads:
    """The run reads of one store (`Client`'s read methods answer through it)."""

    __slots__ = ("store",)

    def __init__(self, store: StateStore):
        self.store = store

    async def get_run(self, run_id: str) -> WorkflowRun | None:
        """The run, or None when unknown."""
        return await self.store.get_run(run_id)

    async def list_runs(self, **query: Any) -> list[WorkflowRun]:
        """Runs matching the keyword filters of `RunQuery` (status, workflow, tags, …)."""
        return await self.store.list_runs(RunQuery(**query))

    async def list_run_items(self, **query: Any) -> list[RunListItem]:
        """`list_runs` with what each listed run waits on (`RunListItem.waiting`: a
        signal, an event, a child, a timer), as a console's run list shows it: the runs,
        then one waiter read when any listed run is suspended."""
        return await lists.list_run_items(self.store, RunQuery(**query))

    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]:
        """The run's checkpoint rows in seq order."""
        return await self.store.list_checkpoints(run_id)

    async def export_history(self, run_id: str) -> dict[str, Any]:
        """The run's history as a versioned JSON document (`{"format": "durably.history",
        "version": 1, "run": {...}, "checkpoints": [...]}`): the run row and every
        checkpoint row in seq order, payloads as stored JSON. A file of it replays the run
        against new code (`durably.testing.Replayer`). `RunNotFoundError` when unknown."""
        return await read_history(self.store, run_id)

    async def get_run_children(self, run_id: str) -> list[str]:
        """The ids of the runs this run started (children, fan members, handlers)."""
        return await get_run_children(self.store, run_id)

    async def get_event(self, run_id: str, key: str) -> Any:
        """The latest value `ctx.set_event(key, …)` recorded, or None."""
        cp = await self.store.get_latest_checkpoint_by_name(run_id, f"event:{key}")
        return cp.output if cp is not None else None

    async def get_run_detail(
        self,
        run_id: str,
        *,
        summarize_fans_over: int | None = None,
        if_none_match: str | None = None,
    ) -> RunDetail | None:
        """The run with its timeline and children; None when unknown.

        `summarize_fans_over=None` (default): the full timeline, no etag, `if_none_match`
        ignored. An integer `n >= 0`: every fan wider than `n` members (or declared wider)
        leaves the timeline and becomes one `FanSummary` in `fans`; `children` is capped at
        200 with the total in `child_count`; the answer carries an `etag`. When
        `if_none_match` matches it, the answer is `not_modified=True` with the run and the
        etag and empty `timeline`/`children` placeholders (keep what you hold) — and no
        checkpoint row was read.
        """
        options = RunDetailOptions(
            summarize_fans_over=summarize_fans_over, if_none_match=if_none_match
        )
        return await store_run_detail(self.store, run_id, options, self.get_run_children)

    async def get_fan_members(
        self,
        run_id: str,
        group: str,
        *,
        offset: int = 0,
        limit: int = FAN_PAGE_DEFAULT_LIMIT,
        failed_only: bool = False,
        if_none_match: str | None = None,
    ) -> FanPage | None:
        """One page of a fan's member rows in seq order; None
        when the run is unknown, `{items: [], total: 0}` for an unknown group.

        `limit` is clamped to 1..1000 and a negative `offset` reads as 0; `failed_only`
        keeps failed members (a failed row, a child completion with `ok: false`, a folded
        row with a failure) and `total` counts the matching rows across pages. The page
        carries an `etag`; a matching `if_none_match` answers `not_modified=True` with
        `items=()` and `total=0` placeholders, having read only the fan's aggregates.
        """
        query = FanPageQuery(
            offset=offset, limit=limit, failed_only=failed_only, if_none_match=if_none_match
        )
        return await store_fan_members(self.store, run_id, group, query)

    async def run_facets(self, **query: Any) -> list[RunFacetRow]:
        """Run counts by (status, origin) over the WHOLE filtered set: the
        status/origin filters and the page of `query` are dropped, so the console's chips
        keep their counts while the list is paged. One `GROUP BY` on the SQL store."""
        return await lists.run_facets(self.store, lists.as_run_query(**query))

    async def run_activity(self, window: ActivityWindow, **query: Any) -> list[ActivityBucket]:
        """Runs started, completed and failed per time bucket of `window` among the runs
        matching `query` (the list's filters; its page ignored): one `ActivityBucket` per
        bucket that saw something, in time order. A run counts as started in the bucket of
        its creation, and as completed or failed — its status now — in the bucket of its
        last change. The store counts (two `GROUP BY`s on the SQL store), so the answer has
        at most one row per bucket whatever the number of runs."""
        return await lists.run_activity(self.store, window, lists.as_run_query(**query))

    async def run_value_facets(
        self,
        axis: RunValueAxis | Mapping[str, Any] | str,
        options: RunValueFacetOptions | Mapping[str, Any] | None = None,
        **query: Any,
    ) -> list[RunValueFacetRow]:
        """The values that fill a filter picker: `axis` is a run column
        (`"workflow"`, `"tag"`, …) or a search attribute, counted over the filtered runs;
        `[]` when the store cannot enumerate them (the picker falls back to free text)."""
        return await lists.run_value_facets(self.store, axis, lists.as_run_query(**query), options)

    async def waiting_for(self, run_ids: Iterable[str]) -> dict[str, RunWaiting]:
        """What each suspended run waits for: a signal, an event, a child,
        a timer; one waiter read for the whole list."""
        return await lists.waiting_for(self.store, run_ids)

    async def count_runs(self, **query: Any) -> int:
        """How many runs match `query` (its page ignored): exact while the list is paged."""
        return await lists.count_runs(self.store, lists.as_run_query(**query))


async def read_fleet(
    transport: str, directory: WorkerDirectory, known: Iterable[str] = ()
) -> fleet.FleetRead:
    """One transport member's live workers: their liveness entries, their descriptors and the
    depth of every token they beat on (and of the `known` tokens). A member that cannot be
    read answers with the reason instead of raising: worker health is what an operator opens
    when something is wrong, so one sick broker must not hide the rest of the answer."""
    try:
        beats, raw = await asyncio.gather(
            directory.read_worker_heartbeats(), directory.read_worker_descriptors()
        )
        tokens = fleet.tokens_to_measure(beats, known)
        depths: dict[str, int] = {}
        for at in range(0, len(tokens), _DEPTH_READS_AT_ONCE):
            chunk = tokens[at : at + _DEPTH_READS_AT_ONCE]
            counts = await asyncio.gather(*(directory.queue_depth(t) for t in chunk))
            depths.update(zip(chunk, counts, strict=True))
    except Exception as exc:  # any broker failure, whatever the transport's client raises
        log.warning("could not read the live workers of transport %r: %s", transport, exc)
        return fleet.FleetRead(transport, error=f"{type(exc).__name__}: {exc}")
    return fleet.FleetRead(transport, tuple(beats), fleet.parse_descriptors(raw), depths)


class WorkerHealth:
    """Worker health as one engine sees it: itself when it drives runs, and the workers its
    transports report.

    Collaborators: the store and clock (run leases), the lease length and the engine's
    namespace, and three views of the engine's worker — this process as a worker
    (`local_worker`), the transport members that list live workers (`directories`) and the
    workflows registered here (`workflows`).
    """

    def __init__(
        self,
        store: StateStore,
        *,
        clock: Callable[[], int],
        lease_ms: int,
        namespace: str | None,
        local_worker: Callable[[], lists.LocalWorker | None],
        directories: Callable[[], list[tuple[str, WorkerDirectory]]],
        workflows: Callable[[], list[Workflow[Any, Any]]],
    ):
        self._store = store
        self._clock = clock
        self._lease_ms = lease_ms
        self._namespace = namespace
        self._local_worker = local_worker
        self._directories = directories
        self._workflows = workflows

    def _remote_workflow_tokens(self) -> set[str]:
        """The tokens this engine sends workflow turns to (its remote workflows')."""
        return {
            wf.token_for(self._namespace)
            for wf in self._workflows()
            if isinstance(wf, RemoteWorkflow)
        }

    async def _read_fleet(self, known: Iterable[str] = ()) -> Sequence[fleet.FleetRead]:
        wanted = tuple(known)
        return await asyncio.gather(*(read_fleet(i, d, wanted) for i, d in self._directories()))

    async def worker_health(self) -> list[GroupHealth]:
        """Worker groups and their health.

        First what the store tells (`durably._read.lists.worker_health`): one `runs@<ns>`
        group per namespace with its backlog and the owners of live run leases, this engine
        included when it drives runs. Then, for each transport that says which workers are
        live (Redis), one group per routing token (`transport` names the pool member): its
        queue depth and every worker beating on it, with the status it reports and what its
        descriptor says (runtime, SDK, capabilities, workflows and steps served). Tokens of
        every namespace are listed. A token this engine sends workflow turns to appears while
        its queue holds tasks, even with nobody serving it. A transport that cannot be read
        is left out (logged; `workflow_directory` says why)."""
        known = self._remote_workflow_tokens()
        stored, reads = await asyncio.gather(
            lists.worker_health(
                self._store,
                now_ms=self._clock(),
                lease_ms=self._lease_ms,
                namespace=self._namespace,
                local=self._local_worker(),
            ),
            self._read_fleet(known),
        )
        out = list(stored)
        for read in reads:
            out.extend(fleet.fleet_groups(read, workflow_tokens=known))
        return out

    async def workflow_directory(self) -> WorkflowDirectory:
        """The workflows the live workers announce, one entry per name and version, with the
        values they state (groups, origins, required capabilities, onError routes) and where
        they disagree — announced onError routes of a workflow are not followed while its
        workers disagree on them. Workers beating on a token no descriptor accounts for are
        listed as `observed`. An engine in a namespace sees that namespace's workers and
        counts the others in `other_partitions`; `detail` says what the answer means."""
        return fleet.workflow_directory(await self._read_fleet(), namespace=self._namespace)
