"""Run detail and fan pages read from a store.

- `store_run_detail(store, run_id, options, children_of=None)`: without
  `summarize_fans_over`, the full timeline and the run's children (no etag). With it, the
  store-aggregate path: the checkpoint statistics give the etag, a matching `if_none_match`
  answers not-modified, else wide fans are summarised from the aggregates plus a bounded
  number of rows.
- `store_fan_members(store, run_id, group, query)`: None for an unknown run, else one page
  of the fan's members (with etag / not-modified).

Not-modified is a value, not an exception: a `RunDetail` with `not_modified=True`, the run,
the etag and empty `timeline`/`children` placeholders (no `fans`/`childCount`); a `FanPage`
with `not_modified=True`, the etag, `items=()` and `total=0`. Answering it reads the run row
and the aggregates only — never a checkpoint row.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from durably._core.models import WorkflowRun
from durably._read.etag import etag_matches, run_detail_etag
from durably._read.models import FanPage, FanPageQuery, RunDetail, RunDetailOptions
from durably._read.store_path import page_fan_from_store, summarize_run_from_store
from durably._read.stores import RunDetailStore
from durably._read.vocabulary import CHILD_EDGE_PREFIXES, child_ids_of
from durably._store.protocol import CheckpointStore

__all__ = [
    "ChildrenOf",
    "detail_options",
    "store_fan_members",
    "store_run_detail",
]

ChildrenOf = Callable[[str], Awaitable[list[str]]]
"""`engine.get_run_children`: a run's child ids, waiters first."""


def detail_options(options: RunDetailOptions | Mapping[str, Any] | None) -> RunDetailOptions:
    """A `RunDetailOptions` from itself, its JSON (camelCase) form, or None (= no options)."""
    if options is None:
        return RunDetailOptions()
    if isinstance(options, RunDetailOptions):
        return options
    return RunDetailOptions.from_json(options)


async def _children_from_store(store: CheckpointStore, run_id: str) -> list[str]:
    # Without an engine to ask: the child ids of the run's child-edge rows.
    rows = await store.list_checkpoints_by_name_prefix(run_id, list(CHILD_EDGE_PREFIXES))
    return child_ids_of(rows)


async def store_run_detail(
    store: RunDetailStore,
    run_id: str,
    options: RunDetailOptions | Mapping[str, Any] | None = None,
    children_of: ChildrenOf | None = None,
) -> RunDetail | None:
    """A run's detail; None for an unknown run.

    Without `summarize_fans_over`: the full timeline and `children_of(run_id)` (no etag;
    `if_none_match` ignored). With it: stats → `run_detail_etag`; a matching `if_none_match`
    answers not-modified (run + stats read, nothing else); else `summarize_run_from_store`.
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
    stats = await store.checkpoint_stats(run_id)
    etag = run_detail_etag(run, stats, over)
    if etag_matches(opts.if_none_match, etag):
        return RunDetail(run=run, etag=etag, not_modified=True)
    s = await summarize_run_from_store(store, run_id, over, stats)
    return RunDetail(
        run=run,
        timeline=s.timeline,
        children=s.children,
        fans=s.fans,
        child_count=s.child_count,
        etag=etag,
    )


async def store_fan_members(
    store: RunDetailStore,
    run_id: str,
    group: str,
    query: FanPageQuery | Mapping[str, Any] | None = None,
) -> FanPage | None:
    """One page of a fan's members (`page_fan_from_store`, with etag / not-modified); None
    for an unknown run."""
    if await store.get_run(run_id) is None:
        return None
    return await page_fan_from_store(store, run_id, group, FanPageQuery.coerce(query))
