"""Read-side data objects: run detail, fan summaries and fan pages.

Same style as `durably._core.models`: immutable slotted dataclasses with snake_case
attributes; `to_json()` / `from_json()` (derived by `durably._core.jsonshape`) use camelCase
keys, omit absent optional fields (never `null`), and write the read side's own dates as
JavaScript `toISOString` strings (millisecond precision, `Z`) — the form a browser client
parses. Nested runs and checkpoints keep their own full-precision form.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from durably._core.jsonshape import JsonObject, iso_ms, json_field, parse_datetime
from durably._core.models import StepCheckpoint, WorkflowRun

__all__ = [
    "FanPage",
    "FanPageQuery",
    "FanSummary",
    "RunDetail",
    "RunDetailOptions",
    "RunSummary",
    "TimelineSummary",
    "iso_ms",
    "parse_iso",
]

parse_iso = parse_datetime
"""Inverse of `iso_ms` (tolerates any ISO-8601 form, epoch ms and datetimes)."""


# ---------------------------------------------------------------- options


@dataclass(frozen=True, slots=True)
class RunDetailOptions(JsonObject, dates="iso_ms"):
    """What a run-detail read asks for: `{summarizeFansOver?, ifNoneMatch?}` — summarise fans
    wider than this many members, and answer "not modified" when the ETag matches."""

    summarize_fans_over: int | None = None
    if_none_match: str | None = None


# ---------------------------------------------------------------- fan summary


@dataclass(frozen=True, slots=True)
class FanSummary(
    JsonObject,
    dates="iso_ms",
    # The identity and counts first, the failed members (largest) last.
    order=(
        "group",
        "label",
        "first_seq",
        "last_seq",
        "size",
        "total",
        "not_started",
        "fail_fast",
        "counts",
        "started_at",
        "finished_at",
        "failures",
    ),
):
    """One wide fan in place of its members.

    `counts` holds only non-zero statuses (`pending`/`running`/`completed`/`failed`);
    `failures` are the first `FAN_SUMMARY_FAILURES` failed member rows in seq order.
    """

    group: str
    label: str = field(metadata=json_field(read_default=""))
    first_seq: int
    last_seq: int
    size: int = field(metadata=json_field(read_default=0))
    fail_fast: bool = field(metadata=json_field(read_default=False))
    counts: Mapping[str, int] = field(default_factory=dict)
    failures: tuple[StepCheckpoint, ...] = ()
    total: int | None = None
    not_started: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class TimelineSummary:
    """`summarize_timeline` result: the timeline without wide fans' members, and one
    FanSummary per wide fan ordered by `firstSeq`."""

    timeline: tuple[StepCheckpoint, ...]
    fans: tuple[FanSummary, ...]


@dataclass(frozen=True, slots=True)
class RunSummary:
    """`summarize_run_in_memory` / `summarize_run_from_store` result: the summarised
    timeline, its wide fans, the child run ids and how many there are."""

    timeline: tuple[StepCheckpoint, ...]
    fans: tuple[FanSummary, ...]
    children: tuple[str, ...]
    child_count: int


# ---------------------------------------------------------------- run detail


@dataclass(frozen=True, slots=True)
class RunDetail(JsonObject, dates="iso_ms"):
    """A run with its timeline and children, as the run-detail read returns it.

    Unsummarised: `fans`/`child_count`/`etag` are None. Summarised: `fans` (possibly empty)
    and `child_count` are set. `not_modified=True` (store path only): `timeline` and
    `children` are empty placeholders — the caller keeps what it holds.
    """

    run: WorkflowRun
    timeline: tuple[StepCheckpoint, ...] = ()
    children: tuple[str, ...] = ()
    fans: tuple[FanSummary, ...] | None = None
    child_count: int | None = None
    etag: str | None = None
    not_modified: bool = field(default=False, metadata=json_field(write="truthy"))


# ---------------------------------------------------------------- fan paging


@dataclass(frozen=True, slots=True)
class FanPageQuery(JsonObject, dates="iso_ms"):
    """One page of a fan's members: `{offset?, limit?, failedOnly?, ifNoneMatch?}`.

    `offset`/`limit` are read by `fan_page_bounds`, which tolerates untyped input (a JSON
    string, a bool, NaN): anything that is not a finite number is the default, so they are
    kept here as given.
    """

    offset: int | float | None = None
    limit: int | float | None = None
    failed_only: bool = field(default=False, metadata=json_field(write="truthy"))
    if_none_match: str | None = None

    @classmethod
    def coerce(cls, query: FanPageQuery | Mapping[str, Any] | None) -> FanPageQuery:
        """A query object from a FanPageQuery, its JSON form, or None (= all defaults)."""
        if query is None:
            return cls()
        if isinstance(query, FanPageQuery):
            return query
        return cls.from_json(query)


@dataclass(frozen=True, slots=True)
class FanPage(JsonObject, dates="iso_ms"):
    """`{items, total, etag?, notModified?}`: one page of a fan's member rows.

    `total` counts the rows matching the query across all pages (a folded row is one row).
    With `not_modified`, `items == ()` and `total == 0` are placeholders.
    """

    items: tuple[StepCheckpoint, ...] = ()
    total: int = 0
    etag: str | None = None
    not_modified: bool = field(default=False, metadata=json_field(write="truthy"))
