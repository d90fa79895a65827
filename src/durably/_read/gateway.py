"""The control plane's store-backed RunGateway: run detail and fan pages (run-detail.md §1.1,
§7.2, §10, §11).

- `store_run_detail(store, run_id, options, children_of=None)` — §7.2: unsummarised detail
  (full timeline, no etag) when `summarizeFansOver` is absent; else the store-aggregate path
  with a `run_detail_etag` when the store aggregates (§10), or the in-memory path (§9, no
  etag) when it does not.
- `store_fan_members(store, run_id, group, query)` — §1.1: `None` for an unknown run, else
  `page_fan_from_store` (§10.4) or `page_fan` over the full list.
- `StoreRunGateway(engine, store=None)` binds both to an engine's store, plus `topology`,
  `get_run`, `list_runs` and the engine's control verbs.

Not-modified (§11.3) is a value, not an exception: a `RunDetail` with `not_modified=True`,
the run, the etag and empty `timeline`/`children` placeholders (no `fans`/`childCount`); a
`FanPage` with `not_modified=True`, the etag, `items=()` and `total=0`. Answering it reads
the run row and the aggregates only — never a checkpoint row.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from durably._core.aggregates import aggregates_checkpoints
from durably._core.models import RunQuery, RunResult, StepCheckpoint, WorkflowRun
from durably._read.etag import etag_matches, run_detail_etag
from durably._read.models import FanPage, FanPageQuery, RunDetail, RunDetailOptions
from durably._read.store_path import (
    AggregatingStore,
    page_fan_from_store,
    summarize_run_from_store,
)
from durably._read.summarize import page_fan, summarize_run_in_memory
from durably._read.vocabulary import CHILD_EDGE_PREFIXES, child_ids_of

if TYPE_CHECKING:
    from durably._engine.engine import Engine
    from durably._engine.events import EngineEvent

__all__ = [
    "ChildrenOf",
    "StoreRunGateway",
    "detail_options",
    "store_fan_members",
    "store_run_detail",
]

ChildrenOf = Callable[[str], Awaitable[list[str]]]
"""`engine.get_run_children` (run-detail.md §7.2): a run's child ids, waiters first."""


def detail_options(options: RunDetailOptions | Mapping[str, Any] | None) -> RunDetailOptions:
    """A `RunDetailOptions` from itself, its JSON (camelCase) form, or None (= no options)."""
    if options is None:
        return RunDetailOptions()
    if isinstance(options, RunDetailOptions):
        return options
    return RunDetailOptions.from_json(options)


async def _children_from_store(store: Any, run_id: str) -> list[str]:
    # The engine-less fallback of `get_run_children`: child ids of the child-edge rows.
    by_prefix = getattr(store, "list_checkpoints_by_name_prefix", None)
    rows: list[StepCheckpoint]
    if by_prefix is not None:
        rows = await by_prefix(run_id, list(CHILD_EDGE_PREFIXES))
    else:
        rows = await store.list_checkpoints(run_id)
    return child_ids_of(rows)


async def store_run_detail(
    store: Any,
    run_id: str,
    options: RunDetailOptions | Mapping[str, Any] | None = None,
    children_of: ChildrenOf | None = None,
) -> RunDetail | None:
    """Store gateway `get_run_detail(run_id, options)` (run-detail.md §7.2).

    Unknown run → None. Without `summarizeFansOver`: the full timeline and
    `children_of(run_id)` (no etag; `ifNoneMatch` ignored). With it, on an aggregating
    store: stats → `run_detail_etag`; a matching `ifNoneMatch` answers not-modified
    (run + stats read, nothing else); else `summarize_run_from_store`. On a store without
    aggregates: `summarize_run_in_memory` over the full list, never an etag.
    """
    run: WorkflowRun | None = await store.get_run(run_id)
    if run is None:
        return None
    opts = detail_options(options)
    over = opts.summarize_fans_over
    if over is None:
        timeline = await store.list_checkpoints(run_id)
        if children_of is not None:
            children = await children_of(run_id)
        else:
            children = await _children_from_store(store, run_id)
        return RunDetail(run=run, timeline=tuple(timeline), children=tuple(children))
    over = max(0, int(over))
    if aggregates_checkpoints(store):
        agg = cast(AggregatingStore, store)
        stats = await agg.checkpoint_stats(run_id)
        etag = run_detail_etag(run, stats, over)
        if etag_matches(opts.if_none_match, etag):
            return RunDetail(run=run, etag=etag, not_modified=True)
        s = await summarize_run_from_store(agg, run_id, over, stats)
        return RunDetail(
            run=run,
            timeline=s.timeline,
            children=s.children,
            fans=s.fans,
            child_count=s.child_count,
            etag=etag,
        )
    s = summarize_run_in_memory(await store.list_checkpoints(run_id), over)
    return RunDetail(
        run=run, timeline=s.timeline, children=s.children, fans=s.fans, child_count=s.child_count
    )


async def store_fan_members(
    store: Any,
    run_id: str,
    group: str,
    query: FanPageQuery | Mapping[str, Any] | None = None,
) -> FanPage | None:
    """Store gateway `get_fan_members(run_id, group, query)` (run-detail.md §1.1): None for
    an unknown run; `page_fan_from_store` (with etag / not-modified) on an aggregating store,
    else `page_fan` over `list_checkpoints` (no etag)."""
    if await store.get_run(run_id) is None:
        return None
    q = FanPageQuery.coerce(query)
    if aggregates_checkpoints(store):
        return await page_fan_from_store(cast(AggregatingStore, store), run_id, group, q)
    return page_fan(await store.list_checkpoints(run_id), group, q)


class StoreRunGateway:
    """The control plane's RunGateway (run-detail.md §1.1), bound to an engine and its store.

    Facets, value facets, `waiting_for` and worker health (§2–§6) are not on this class yet;
    `list_runs` returns the store's rows without `waiting` stamping (§2).
    """

    def __init__(self, engine: Engine, store: Any = None) -> None:
        self.engine = engine
        self.store: Any = store if store is not None else engine.store

    def topology(self) -> dict[str, str]:
        return {"role": "control-plane"}

    async def get_run_detail(
        self, run_id: str, options: RunDetailOptions | Mapping[str, Any] | None = None
    ) -> RunDetail | None:
        return await store_run_detail(self.store, run_id, options, self.engine.get_run_children)

    async def get_fan_members(
        self, run_id: str, group: str, query: FanPageQuery | Mapping[str, Any] | None = None
    ) -> FanPage | None:
        return await store_fan_members(self.store, run_id, group, query)

    async def get_run(self, run_id: str) -> WorkflowRun | None:
        run: WorkflowRun | None = await self.store.get_run(run_id)
        return run

    async def list_runs(self, query: RunQuery | None = None) -> list[WorkflowRun]:
        runs: list[WorkflowRun] = await self.store.list_runs(query or RunQuery())
        return runs

    async def cancel(self, run_id: str, compensate: bool = False) -> RunResult | None:
        return await self.engine.cancel(run_id, compensate=compensate)

    async def retry(self, run_id: str) -> RunResult | None:
        return await self.engine.requeue(run_id)

    async def continue_(self, run_id: str) -> RunResult | None:
        return await self.engine.continue_run(run_id)

    async def redispatch_pending(self, run_id: str) -> dict[str, Any] | None:
        return await self.engine.redispatch_pending(run_id)

    async def retry_with_input(self, run_id: str, input: Any) -> dict[str, str] | None:
        """A fresh linked run: `{runId}`, or None for an unknown run."""
        new_id = await self.engine.retry_with_input(run_id, input)
        return None if new_id is None else {"runId": new_id}

    def subscribe(self, run_id: str, on_event: Callable[[EngineEvent], Any]) -> Callable[[], None]:
        """Engine events of one run; the returned callable unsubscribes (idempotent)."""

        def listener(event: EngineEvent) -> Any:
            if event.run_id == run_id:
                return on_event(event)
            return None

        unsubscribe = self.engine.subscribe(listener)
        done = False

        def stop() -> None:
            nonlocal done
            if not done:
                done = True
                unsubscribe()

        return stop
