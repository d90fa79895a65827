"""Read-side data objects: run detail, fan summaries and fan pages (run-detail.md §7, §9).

Same style as `durably._core.models`: immutable slotted dataclasses with snake_case
attributes; `to_json()` / `from_json()` use the spec's camelCase keys, omit absent optional
fields (never `null`), and write dates as JS `toISOString` strings (millisecond precision,
`Z` suffix — run-detail.md §0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

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


def iso_ms(value: datetime) -> str:
    """JS `Date.prototype.toISOString`: UTC, millisecond precision, `Z` (run-detail.md §0).
    A naive datetime is taken as UTC (the engine only writes aware ones)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    value = value.astimezone(UTC)
    return f"{value:%Y-%m-%dT%H:%M:%S}.{value.microsecond // 1000:03d}Z"


def parse_iso(value: Any) -> datetime | None:
    """Inverse of `iso_ms` (tolerates any ISO-8601 form, epoch ms and datetimes)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value / 1000.0, tz=UTC)
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _opt_int(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


# ---------------------------------------------------------------- options (§7.1)


@dataclass(frozen=True, slots=True)
class RunDetailOptions:
    """`RunDetailOptions` (0.79, run-detail.md §7.1): `{summarizeFansOver?, ifNoneMatch?}`."""

    summarize_fans_over: int | None = None
    if_none_match: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.summarize_fans_over is not None:
            out["summarizeFansOver"] = self.summarize_fans_over
        if self.if_none_match is not None:
            out["ifNoneMatch"] = self.if_none_match
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunDetailOptions:
        match = data.get("ifNoneMatch")
        return cls(
            summarize_fans_over=_opt_int(data.get("summarizeFansOver")),
            if_none_match=match if isinstance(match, str) else None,
        )


# ---------------------------------------------------------------- fan summary (§9.1)


@dataclass(frozen=True, slots=True)
class FanSummary:
    """One wide fan in place of its members (run-detail.md §9.1, engine.md §3.8.4).

    `counts` holds only non-zero statuses (`pending`/`running`/`completed`/`failed`);
    `failures` are the first `FAN_SUMMARY_FAILURES` failed member rows in seq order.
    """

    group: str
    label: str
    first_seq: int
    last_seq: int
    size: int
    fail_fast: bool
    counts: Mapping[str, int] = field(default_factory=dict)
    failures: tuple[StepCheckpoint, ...] = ()
    total: int | None = None
    not_started: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "group": self.group,
            "label": self.label,
            "firstSeq": self.first_seq,
            "lastSeq": self.last_seq,
            "size": self.size,
        }
        if self.total is not None:
            out["total"] = self.total
        if self.not_started is not None:
            out["notStarted"] = self.not_started
        out["failFast"] = self.fail_fast
        out["counts"] = dict(self.counts)
        if self.started_at is not None:
            out["startedAt"] = iso_ms(self.started_at)
        if self.finished_at is not None:
            out["finishedAt"] = iso_ms(self.finished_at)
        out["failures"] = [cp.to_json() for cp in self.failures]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FanSummary:
        counts = data.get("counts")
        return cls(
            group=str(data["group"]),
            label=str(data.get("label", "")),
            first_seq=int(data["firstSeq"]),
            last_seq=int(data["lastSeq"]),
            size=int(data.get("size", 0)),
            total=_opt_int(data.get("total")),
            not_started=_opt_int(data.get("notStarted")),
            fail_fast=bool(data.get("failFast", False)),
            counts={str(k): int(v) for k, v in counts.items()}
            if isinstance(counts, Mapping)
            else {},
            started_at=parse_iso(data.get("startedAt")),
            finished_at=parse_iso(data.get("finishedAt")),
            failures=tuple(StepCheckpoint.from_json(cp) for cp in data.get("failures") or ()),
        )


@dataclass(frozen=True, slots=True)
class TimelineSummary:
    """`summarize_timeline` result (§9.2): the timeline without wide fans' members, and
    one FanSummary per wide fan ordered by `firstSeq`."""

    timeline: tuple[StepCheckpoint, ...]
    fans: tuple[FanSummary, ...]


@dataclass(frozen=True, slots=True)
class RunSummary:
    """`summarize_run_in_memory` / `summarize_run_from_store` result (§9.3, §10.1)."""

    timeline: tuple[StepCheckpoint, ...]
    fans: tuple[FanSummary, ...]
    children: tuple[str, ...]
    child_count: int


# ---------------------------------------------------------------- run detail (§7.1)


@dataclass(frozen=True, slots=True)
class RunDetail:
    """`RunDetail` (run-detail.md §7.1).

    Unsummarised: `fans`/`child_count`/`etag` are None. Summarised: `fans` (possibly empty)
    and `child_count` are set. `not_modified=True` (store path only): `timeline` and
    `children` are empty placeholders — the caller keeps what it holds (§11.3).
    """

    run: WorkflowRun
    timeline: tuple[StepCheckpoint, ...] = ()
    children: tuple[str, ...] = ()
    fans: tuple[FanSummary, ...] | None = None
    child_count: int | None = None
    etag: str | None = None
    not_modified: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "run": self.run.to_json(),
            "timeline": [cp.to_json() for cp in self.timeline],
            "children": list(self.children),
        }
        if self.fans is not None:
            out["fans"] = [f.to_json() for f in self.fans]
        if self.child_count is not None:
            out["childCount"] = self.child_count
        if self.etag is not None:
            out["etag"] = self.etag
        if self.not_modified:
            out["notModified"] = True
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunDetail:
        fans = data.get("fans")
        etag = data.get("etag")
        return cls(
            run=WorkflowRun.from_json(data["run"]),
            timeline=tuple(StepCheckpoint.from_json(cp) for cp in data.get("timeline") or ()),
            children=tuple(str(c) for c in data.get("children") or ()),
            fans=tuple(FanSummary.from_json(f) for f in fans) if isinstance(fans, list) else None,
            child_count=_opt_int(data.get("childCount")),
            etag=etag if isinstance(etag, str) else None,
            not_modified=data.get("notModified") is True,
        )


# ---------------------------------------------------------------- fan paging (§9.5)


@dataclass(frozen=True, slots=True)
class FanPageQuery:
    """`FanPageQuery = {offset?, limit?, failedOnly?, ifNoneMatch?}` (run-detail.md §9.5).

    `offset`/`limit` are read by `fan_page_bounds` (§9.4), which tolerates untyped input
    (a JSON string, a bool, NaN): anything that is not a finite number is the default.
    """

    offset: int | float | None = None
    limit: int | float | None = None
    failed_only: bool = False
    if_none_match: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.offset is not None:
            out["offset"] = self.offset
        if self.limit is not None:
            out["limit"] = self.limit
        if self.failed_only:
            out["failedOnly"] = True
        if self.if_none_match is not None:
            out["ifNoneMatch"] = self.if_none_match
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FanPageQuery:
        """Raw values are kept as given (bounds are clamped when read, §9.4)."""
        match = data.get("ifNoneMatch")
        return cls(
            offset=data.get("offset"),
            limit=data.get("limit"),
            failed_only=data.get("failedOnly") is True,
            if_none_match=match if isinstance(match, str) else None,
        )

    @classmethod
    def coerce(cls, query: FanPageQuery | Mapping[str, Any] | None) -> FanPageQuery:
        """A query object from a FanPageQuery, its JSON form, or None (= all defaults)."""
        if query is None:
            return cls()
        if isinstance(query, FanPageQuery):
            return query
        return cls.from_json(query)


@dataclass(frozen=True, slots=True)
class FanPage:
    """`FanPage = {items, total, etag?, notModified?}` (run-detail.md §9.5).

    `total` counts the rows matching the query across all pages (a folded row is one row).
    With `not_modified`, `items == ()` and `total == 0` are placeholders (§11.3).
    """

    items: tuple[StepCheckpoint, ...] = ()
    total: int = 0
    etag: str | None = None
    not_modified: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "items": [cp.to_json() for cp in self.items],
            "total": self.total,
        }
        if self.etag is not None:
            out["etag"] = self.etag
        if self.not_modified:
            out["notModified"] = True
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FanPage:
        etag = data.get("etag")
        return cls(
            items=tuple(StepCheckpoint.from_json(cp) for cp in data.get("items") or ()),
            total=int(data.get("total", 0)),
            etag=etag if isinstance(etag, str) else None,
            not_modified=data.get("notModified") is True,
        )
