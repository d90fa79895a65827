"""The store-aggregate read path.

Every store aggregates its checkpoints; this path gives the same answers as the in-memory reference
(`summarize.py`: `summarize_run_in_memory` / `page_fan`) for the same rows, read from one
`GROUP BY` (`checkpoint_stats`) plus a bounded number of rows (`query_checkpoints`, filtered
and paged by the store). It never calls `list_checkpoints`. What it reads:

- the aggregates (one statement);
- every row outside wide fans (the returned timeline);
- every folded `fan:` row (one per settled wave), only when a folded bucket exists;
- per wide fan: at most `FAN_SUMMARY_FAILURES` `failed`-status rows, and — only while a
  child fan is in flight — all of its completed `signal:child:` rows (their `ok: false`
  payload is the only mark of a failed child);
- the first child-edge rows, a page of `SUMMARY_CHILD_LIMIT` at a time, until that many ids
  are known.

Its answers must equal the in-memory reference field by field; tests/read/test_store_path.py
checks that.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from durably._core.aggregates import CheckpointQuery, CheckpointStat
from durably._core.models import CheckpointStatus, StepCheckpoint
from durably._read.etag import etag_matches, fan_page_etag
from durably._read.models import FanPage, FanPageQuery, FanSummary, RunSummary
from durably._read.summarize import (
    CHILD_RUNS_LABEL,
    MIXED_STEPS_LABEL,
    fan_page_bounds,
    fan_settled,
    is_wide,
)
from durably._read.vocabulary import (
    CHILD_EDGE_PREFIXES,
    CHILD_PREFIX,
    FAN_SUMMARY_FAILURES,
    FOLDED_PREFIX,
    SUMMARY_CHILD_LIMIT,
    child_ids_of,
    fan_declaration,
    folded_count,
    folded_failures,
    is_failed_member,
)

__all__ = [
    "AggregatingStore",
    "children_from_aggregates",
    "fan_from_aggregates",
    "page_fan_from_store",
    "summarize_run_from_store",
]


class AggregatingStore(Protocol):
    """The two aggregate store methods the store path uses (and nothing else)."""

    async def checkpoint_stats(
        self, run_id: str, group: str | None = None
    ) -> list[CheckpointStat]: ...

    async def query_checkpoints(
        self, run_id: str, query: CheckpointQuery
    ) -> list[StepCheckpoint]: ...


def _folded_weight(cp: StepCheckpoint) -> int:
    return folded_count(cp) or 0


def _counts_from_aggregates(
    buckets: Iterable[CheckpointStat],
    completed_children: Sequence[StepCheckpoint],
    folded_rows: Iterable[StepCheckpoint],
) -> dict[str, int]:
    """A fan's `counts` (= `fan_counts` over the same rows): only non-zero keys."""
    counts: dict[str, int] = {}

    def add(status: str, n: int) -> None:
        if n > 0:
            counts[status] = counts.get(status, 0) + n

    child_failed = sum(1 for cp in completed_children if is_failed_member(cp))
    for b in buckets:
        if b.name_kind == "folded":
            continue  # counted from the rows below (their payload says what failed)
        if b.name_kind == "child" and b.status == "completed":
            add("failed", child_failed)
            add("completed", b.count - child_failed)
        else:
            add(b.status, b.count)
    for cp in folded_rows:
        failed = len(folded_failures(cp))
        add("failed", failed)
        add("completed", max(0, _folded_weight(cp) - failed))
    return counts


def _label_from_aggregates(buckets: Iterable[CheckpointStat]) -> str:
    """A fan's label: the common name of the `step` buckets when every one has a single name
    (`minName == maxName`) and they all agree; `'child runs'` without step buckets."""
    step_buckets = [b for b in buckets if b.name_kind == "step"]
    if not step_buckets:
        return CHILD_RUNS_LABEL
    names = {b.min_name for b in step_buckets} | {b.max_name for b in step_buckets}
    return next(iter(names)) if len(names) == 1 else MIXED_STEPS_LABEL


async def fan_from_aggregates(
    store: AggregatingStore,
    run_id: str,
    group: str,
    buckets: Sequence[CheckpointStat],
    folded_g: Sequence[StepCheckpoint],
) -> FanSummary:
    """One wide fan's FanSummary from its buckets and its folded rows; equal to
    `summarize_fan(group, members)` over the same rows."""
    if not buckets:
        raise ValueError(f"fan_from_aggregates: group {group!r} has no buckets")
    total, fail_fast = fan_declaration(group)
    size = sum(b.count for b in buckets if b.name_kind != "folded")
    size += sum(_folded_weight(cp) for cp in folded_g)
    not_started = max(0, total - size) if total is not None else None

    completed_children: list[StepCheckpoint] = []
    if any(b.name_kind == "child" and b.status == "completed" for b in buckets):
        completed_children = await store.query_checkpoints(
            run_id,
            CheckpointQuery(group=group, statuses=["completed"], name_prefixes=[CHILD_PREFIX]),
        )
    counts = _counts_from_aggregates(buckets, completed_children, folded_g)

    failures: dict[int, StepCheckpoint] = {}
    if any(b.status == "failed" for b in buckets):
        failed_rows = await store.query_checkpoints(
            run_id, CheckpointQuery(group=group, statuses=["failed"], limit=FAN_SUMMARY_FAILURES)
        )
        failures.update((cp.seq, cp) for cp in failed_rows)
    for cp in (*completed_children, *folded_g):
        if is_failed_member(cp):
            failures.setdefault(cp.seq, cp)
    first_failures = tuple(failures[seq] for seq in sorted(failures)[:FAN_SUMMARY_FAILURES])

    finished_at: datetime | None = None
    if fan_settled(counts, not_started, fail_fast):
        finished_at = max(b.max_finished_at for b in buckets)
    return FanSummary(
        group=group,
        label=_label_from_aggregates(buckets),
        first_seq=min(b.min_seq for b in buckets),
        last_seq=max(b.max_seq for b in buckets),
        size=size,
        total=total,
        not_started=not_started,
        fail_fast=fail_fast,
        counts=counts,
        started_at=min(b.min_enqueued_at for b in buckets),
        finished_at=finished_at,
        failures=first_failures,
    )


async def children_from_aggregates(
    store: AggregatingStore,
    run_id: str,
    stats: Iterable[CheckpointStat],
    folded: Iterable[StepCheckpoint],
) -> tuple[tuple[str, ...], int]:
    """(`children`, `childCount`): the count from the buckets and the folded rows;
    the first `SUMMARY_CHILD_LIMIT` ids from child-edge rows paged in seq order."""
    stats = list(stats)
    count = sum(b.count for b in stats if b.name_kind in ("child", "spawn"))
    count += sum(_folded_weight(cp) for cp in folded)
    if not any(b.name_kind in ("child", "spawn", "folded") for b in stats):
        return (), count
    ids: dict[str, None] = {}
    page = 0
    while len(ids) < SUMMARY_CHILD_LIMIT:
        rows = await store.query_checkpoints(
            run_id,
            CheckpointQuery(
                name_prefixes=list(CHILD_EDGE_PREFIXES),
                offset=page * SUMMARY_CHILD_LIMIT,
                limit=SUMMARY_CHILD_LIMIT,
            ),
        )
        for child_id in child_ids_of(rows):
            ids.setdefault(child_id, None)
        if len(rows) < SUMMARY_CHILD_LIMIT:
            break
        page += 1
    return tuple(list(ids)[:SUMMARY_CHILD_LIMIT]), count


async def summarize_run_from_store(
    store: AggregatingStore,
    run_id: str,
    over: int,
    stats: Sequence[CheckpointStat] | None = None,
) -> RunSummary:
    """The answer of `summarize_run_in_memory(store.list_checkpoints(run_id), over)` without
    reading the members of wide fans. `stats` already read by the caller (for the etag) is
    reused, not re-read."""
    if stats is None:
        stats = await store.checkpoint_stats(run_id)
    folded: list[StepCheckpoint] = []
    if any(b.name_kind == "folded" for b in stats):
        folded = await store.query_checkpoints(
            run_id, CheckpointQuery(name_prefixes=[FOLDED_PREFIX])
        )
    size: dict[str, int] = {}
    for b in stats:
        if b.group is not None and b.name_kind != "folded":
            size[b.group] = size.get(b.group, 0) + b.count
    for cp in folded:
        if cp.parallel_group is not None:
            size[cp.parallel_group] = size.get(cp.parallel_group, 0) + _folded_weight(cp)
    groups = {b.group for b in stats if b.group is not None}
    wide = sorted(g for g in groups if is_wide(g, size.get(g, 0), over))
    timeline = await store.query_checkpoints(run_id, CheckpointQuery(exclude_groups=wide))
    fans = [
        await fan_from_aggregates(
            store,
            run_id,
            g,
            [b for b in stats if b.group == g],
            [cp for cp in folded if cp.parallel_group == g],
        )
        for g in wide
    ]
    fans.sort(key=lambda f: (f.first_seq, f.group))
    children, count = await children_from_aggregates(store, run_id, stats, folded)
    return RunSummary(
        timeline=tuple(timeline), fans=tuple(fans), children=children, child_count=count
    )


def _failed_only_statuses(stats_g: Iterable[CheckpointStat]) -> list[CheckpointStatus]:
    # Non-`failed` rows that can still be failed members: completed child completions, and
    # folded rows (whatever their status; the engine writes them `completed`).
    statuses = {
        b.status
        for b in stats_g
        if (b.name_kind == "child" and b.status == "completed")
        or (b.name_kind == "folded" and b.status != "failed")
    }
    return sorted(statuses)


async def page_fan_from_store(
    store: AggregatingStore,
    run_id: str,
    group: str,
    query: FanPageQuery | Mapping[str, Any] | None = None,
    stats: Sequence[CheckpointStat] | None = None,
) -> FanPage:
    """`page_fan`'s items and total, paged in
    the store, plus `fan_page_etag`. A matching `ifNoneMatch` answers
    `{items: [], total: 0, etag, notModified: true}` having read only the group's buckets."""
    q = FanPageQuery.coerce(query)
    offset, limit = fan_page_bounds(q)
    if stats is not None:
        stats_g = [b for b in stats if b.group == group]
    else:
        stats_g = await store.checkpoint_stats(run_id, group=group)
    etag = fan_page_etag(group, stats_g, q)
    if etag_matches(q.if_none_match, etag):
        return FanPage(etag=etag, not_modified=True)
    if not stats_g:
        return FanPage(items=(), total=0, etag=etag)
    if not q.failed_only:
        items = await store.query_checkpoints(
            run_id, CheckpointQuery(group=group, offset=offset, limit=limit)
        )
        return FanPage(items=tuple(items), total=sum(b.count for b in stats_g), etag=etag)
    cands: dict[int, StepCheckpoint] = {}
    if any(b.status == "failed" for b in stats_g):
        failed = await store.query_checkpoints(
            run_id, CheckpointQuery(group=group, statuses=["failed"])
        )
        cands.update((cp.seq, cp) for cp in failed)
    statuses = _failed_only_statuses(stats_g)
    if statuses:
        more = await store.query_checkpoints(
            run_id,
            CheckpointQuery(
                group=group, statuses=statuses, name_prefixes=[CHILD_PREFIX, FOLDED_PREFIX]
            ),
        )
        for cp in more:
            if is_failed_member(cp):
                cands.setdefault(cp.seq, cp)
    members = [cands[seq] for seq in sorted(cands)]
    return FanPage(items=tuple(members[offset : offset + limit]), total=len(members), etag=etag)
