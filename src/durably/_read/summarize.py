"""In-memory fan summarisation and paging — the reference semantics.

Everything here works on a full checkpoint list (what `list_checkpoints` returns). The
store-aggregate path (`store_path.py`) must produce exactly these answers from aggregates;
tests check the two agree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from numbers import Real
from typing import Any

from durably._core.aggregates import MAX_PAGE_BOUND
from durably._core.models import StepCheckpoint
from durably._read.models import (
    FanPage,
    FanPageQuery,
    FanSummary,
    RunSummary,
    TimelineSummary,
)
from durably._read.vocabulary import (
    FAN_PAGE_DEFAULT_LIMIT,
    FAN_PAGE_MAX_LIMIT,
    FAN_SUMMARY_FAILURES,
    SUMMARY_CHILD_LIMIT,
    checkpoint_name_kind,
    child_count,
    child_ids_of,
    fan_declaration,
    folded_count,
    folded_failures,
    is_failed_member,
    weight,
)

__all__ = [
    "CHILD_RUNS_LABEL",
    "MIXED_STEPS_LABEL",
    "fan_counts",
    "fan_label",
    "fan_page_bounds",
    "fan_settled",
    "is_wide",
    "page_fan",
    "summarize_fan",
    "summarize_run_in_memory",
    "summarize_timeline",
]

CHILD_RUNS_LABEL = "child runs"
"""Label of a fan without `step`-kind members."""
MIXED_STEPS_LABEL = "steps"
"""Label of a fan whose step members have different names."""


def _by_seq(checkpoints: Iterable[StepCheckpoint]) -> list[StepCheckpoint]:
    return sorted(checkpoints, key=lambda cp: cp.seq)  # stable: equal seqs keep their order


# ---------------------------------------------------------------- one fan's summary


def fan_label(members: Iterable[StepCheckpoint]) -> str:
    """`'child runs'` when no member is a plain step; the common name of the step members;
    else `'steps'`."""
    names = {cp.name for cp in members if checkpoint_name_kind(cp.name) == "step"}
    if not names:
        return CHILD_RUNS_LABEL
    if len(names) == 1:
        return next(iter(names))
    return MIXED_STEPS_LABEL


def fan_counts(members: Iterable[StepCheckpoint]) -> dict[str, int]:
    """Members by status: step/spawn rows by status; a completed child row with an
    `ok: false` Completion counts `failed`; a folded row adds its failures to `failed` and
    the rest of its count to `completed`. Only non-zero keys are present."""
    counts: dict[str, int] = {}

    def add(status: str, n: int) -> None:
        if n > 0:
            counts[status] = counts.get(status, 0) + n

    for cp in members:
        kind = checkpoint_name_kind(cp.name)
        if kind == "folded":
            failed = len(folded_failures(cp))
            add("failed", failed)
            add("completed", max(0, (folded_count(cp) or 0) - failed))
        elif kind == "child" and cp.status == "completed" and is_failed_member(cp):
            add("failed", 1)
        else:
            add(cp.status, 1)
    return counts


def fan_settled(
    counts: Mapping[str, int],
    not_started: int | None,
    fail_fast: bool,
) -> bool:
    """When a fan is settled, shared with the store path: no member `pending` /
    `running`, and every declared member started — or a fail-fast fan that stopped early
    on a failure (its `notStarted` stays for good)."""
    if counts.get("pending", 0) > 0 or counts.get("running", 0) > 0:
        return False
    if not not_started:
        return True
    return fail_fast and counts.get("failed", 0) > 0


def summarize_fan(group: str, members: Sequence[StepCheckpoint]) -> FanSummary:
    """One fan's FanSummary. `members` are the group's checkpoints (non-empty); they are
    read in seq order."""
    rows = _by_seq(members)
    if not rows:
        raise ValueError(f"summarize_fan: group {group!r} has no members")
    total, fail_fast = fan_declaration(group)
    size = sum(weight(cp) for cp in rows)
    not_started = max(0, total - size) if total is not None else None
    counts = fan_counts(rows)
    # startedAt = earliest enqueuedAt, which falls back to startedAt.
    started_at = min(cp.enqueued_at or cp.started_at for cp in rows)
    finished_at: datetime | None = None
    if fan_settled(counts, not_started, fail_fast):
        finished_at = max(cp.finished_at for cp in rows)
    failures = [cp for cp in rows if is_failed_member(cp)][:FAN_SUMMARY_FAILURES]
    return FanSummary(
        group=group,
        label=fan_label(rows),
        first_seq=rows[0].seq,
        last_seq=rows[-1].seq,
        size=size,
        total=total,
        not_started=not_started,
        fail_fast=fail_fast,
        counts=counts,
        started_at=started_at,
        finished_at=finished_at,
        failures=tuple(failures),
    )


# ---------------------------------------------------------------- a run's timeline


def is_wide(group: str, size: int, over: int) -> bool:
    """A group is summarised iff `Σ weight > over` or its declared `total > over`."""
    if size > over:
        return True
    total = fan_declaration(group)[0]
    return total is not None and total > over


def summarize_timeline(timeline: Sequence[StepCheckpoint], over: int) -> TimelineSummary:
    """The timeline with every fan wider than `over` replaced by its summary.

    Members of every wide group leave the timeline (the rest keeps its relative order) and
    become one FanSummary each, ordered by `firstSeq` (ties, which only malformed data can
    produce, by group string — the store path's order). `over = 0` summarises every group
    with at least one member; a group of exactly `over` members stays unless declared wider.
    """
    groups: dict[str, list[StepCheckpoint]] = {}
    for cp in timeline:
        if cp.parallel_group is not None:
            groups.setdefault(cp.parallel_group, []).append(cp)
    wide = {g for g, members in groups.items() if is_wide(g, sum(weight(m) for m in members), over)}
    fans = sorted((summarize_fan(g, groups[g]) for g in wide), key=lambda f: (f.first_seq, f.group))
    kept = tuple(cp for cp in timeline if cp.parallel_group not in wide)
    return TimelineSummary(timeline=kept, fans=tuple(fans))


def summarize_run_in_memory(checkpoints: Iterable[StepCheckpoint], over: int) -> RunSummary:
    """A run's summary from its full checkpoint list.

    `timeline`/`fans` from `summarize_timeline`, `children` = the first `SUMMARY_CHILD_LIMIT` ids of
    `child_ids_of`, `child_count` = `child_count` — both over the FULL list (children of
    summarised fans included). Decision: the rows are read in seq order (what
    `list_checkpoints` returns anyway), so the answer does not depend on the caller's order.
    """
    rows = _by_seq(checkpoints)
    summary = summarize_timeline(rows, over)
    return RunSummary(
        timeline=summary.timeline,
        fans=summary.fans,
        children=tuple(child_ids_of(rows)[:SUMMARY_CHILD_LIMIT]),
        child_count=child_count(rows),
    )


# ---------------------------------------------------------------- fan pages


def _finite_number(value: object) -> float | int | None:
    # Booleans are not numbers; NaN and ±inf are not finite.
    if isinstance(value, bool) or not isinstance(value, Real):
        return None
    if isinstance(value, int):
        return value
    as_float = float(value)
    return as_float if math.isfinite(as_float) else None


def fan_page_bounds(query: FanPageQuery | Mapping[str, Any] | None) -> tuple[int, int]:
    """`(offset, limit)` of a fan page.

    offset = `floor(offset)` when a finite number ≥ 0, else 0; limit = `floor(limit)`
    clamped to `[1, FAN_PAGE_MAX_LIMIT]` when a finite number, else
    `FAN_PAGE_DEFAULT_LIMIT`. Accepts the query object or its JSON form (untyped input).
    """
    q = FanPageQuery.coerce(query)
    raw_offset = _finite_number(q.offset)
    offset = math.floor(raw_offset) if raw_offset is not None and raw_offset >= 0 else 0
    offset = min(offset, MAX_PAGE_BOUND)  # beyond every row anyway; keeps SQL ints in range
    raw_limit = _finite_number(q.limit)
    if raw_limit is None:
        limit = FAN_PAGE_DEFAULT_LIMIT
    else:
        limit = min(FAN_PAGE_MAX_LIMIT, max(1, math.floor(raw_limit)))
    return offset, limit


def page_fan(
    timeline: Iterable[StepCheckpoint],
    group: str,
    query: FanPageQuery | Mapping[str, Any] | None = None,
) -> FanPage:
    """One page of a fan's members from a full timeline.

    The group's rows in seq order (with `failedOnly`, only `is_failed_member` rows), sliced
    by `fan_page_bounds`; `total` counts the matching rows (a folded row is one row). No
    etag on this path, so `ifNoneMatch` is ignored; an unknown group → `{items: [], total: 0}`.
    """
    q = FanPageQuery.coerce(query)
    members = [cp for cp in _by_seq(timeline) if cp.parallel_group == group]
    if q.failed_only:
        members = [cp for cp in members if is_failed_member(cp)]
    offset, limit = fan_page_bounds(q)
    return FanPage(items=tuple(members[offset : offset + limit]), total=len(members))
