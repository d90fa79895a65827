"""The public read methods of `Client` and `Engine`: runs, run detail, fan pages, facets.

`ReadApi` needs nothing but the store, so a `Client` in a process without any workflow code
answers exactly what an `Engine` does. `get_run_detail` and `get_fan_members` answer through
the store-backed gateway functions (`durably._read.gateway`), so an aggregating store (every
first-party store) summarises wide fans from a `GROUP BY` plus a bounded number of rows, and
a matching `if_none_match` answers not-modified without reading the timeline.
`WorkerHealthApi` (the health of worker groups, this engine included) is the engine's alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from durably._core.models import RunQuery, StepCheckpoint, WorkflowRun
from durably._engine.operator import get_run_children
from durably._read import lists
from durably._read.gateway import store_fan_members, store_run_detail
from durably._read.list_models import (
    GroupHealth,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    RunWaiting,
)
from durably._read.models import FanPage, FanPageQuery, RunDetail, RunDetailOptions
from durably._read.vocabulary import FAN_PAGE_DEFAULT_LIMIT

if TYPE_CHECKING:
    from durably._engine.options import EngineOptions
    from durably._store.protocol import StateStore

__all__ = ["ReadApi", "WorkerHealthApi"]


class ReadApi:
    """Mixed into `Client` and `Engine` (which provide `store`)."""

    if TYPE_CHECKING:
        store: StateStore

    async def get_run(self, run_id: str) -> WorkflowRun | None:
        """The run, or None when unknown."""
        return await self.store.get_run(run_id)

    async def list_runs(self, **query: Any) -> list[WorkflowRun]:
        """Runs matching the keyword filters of `RunQuery` (status, workflow, tags, …)."""
        return await self.store.list_runs(RunQuery(**query))

    async def list_checkpoints(self, run_id: str) -> list[StepCheckpoint]:
        """The run's checkpoint rows in seq order."""
        return await self.store.list_checkpoints(run_id)

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


class WorkerHealthApi:
    """Mixed into `Engine`: worker health lists this engine itself when it drives runs."""

    if TYPE_CHECKING:
        store: StateStore
        namespace: str | None
        options: EngineOptions

        def clock(self) -> int: ...

        def _local_worker(self) -> lists.LocalWorker | None: ...

    async def worker_health(self) -> list[GroupHealth]:
        """Worker groups and their health, derived from the live leases in the store (see
        `durably._read.lists.worker_health`); this engine is listed when it drives runs."""
        return await lists.worker_health(
            self.store,
            now_ms=self.clock(),
            lease_ms=self.options.lease_ms,
            namespace=self.namespace,
            local=self._local_worker(),
        )
