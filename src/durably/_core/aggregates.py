"""Store-level checkpoint aggregates: `checkpoint_stats` and `query_checkpoints`.

- `CheckpointStat`: one bucket of `checkpoint_stats`, per distinct `(group, status, name_kind)`
  among a run's checkpoints.
- `CheckpointQuery`: the filters and paging of `query_checkpoints`.
- `checkpoint_stats_of` / `query_checkpoints_of`: the in-memory reference semantics over a list
  of checkpoints (what the in-memory store runs, and what the SQL stores must agree with).

The store returns these aggregates only. Which members of a fan failed (a completed
`signal:child:` row whose completion has `ok: false`, or a failed completion inside a folded
`fan:` row) lives in payloads, which a `GROUP BY` never reads: the read side derives it from
the rows `query_checkpoints` returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, cast

from durably._core.jsonshape import JsonObject, json_field
from durably._core.models import CheckpointStatus, StepCheckpoint, checkpoint_name_kind

NameKind = Literal["child", "folded", "spawn", "step"]
NAME_KINDS: tuple[NameKind, ...] = ("child", "folded", "spawn", "step")


def name_kind(name: str) -> NameKind:
    """`checkpoint_name_kind` typed as its `Literal`."""
    return cast(NameKind, checkpoint_name_kind(name))


@dataclass(frozen=True, slots=True)
class CheckpointStat(JsonObject):
    """One `checkpoint_stats` bucket: the checkpoints of one run sharing
    `(parallelGroup, status, nameKind)`. `group` is None for ungrouped checkpoints."""

    group: str | None = field(metadata=json_field(write="always"))
    status: CheckpointStatus
    name_kind: NameKind
    count: int
    min_seq: int
    max_seq: int
    min_name: str
    max_name: str
    min_enqueued_at: datetime
    min_started_at: datetime
    max_started_at: datetime
    max_finished_at: datetime
    sum_attempts: int

    @property
    def key(self) -> tuple[str | None, str, str]:
        """The bucket identity `(group, status, name_kind)`."""
        return (self.group, self.status, self.name_kind)


def stat_sort_key(stat: CheckpointStat) -> tuple[bool, str, str, str]:
    """A total order over buckets (ungrouped first), for comparing stats as sorted lists."""
    return (stat.group is not None, stat.group or "", stat.status, stat.name_kind)


@dataclass(frozen=True, slots=True)
class CheckpointQuery:
    """Filters of `query_checkpoints`. Every field is optional; an absent
    (None) filter does not narrow; all present filters are ANDed.

    - `group`: only checkpoints with this `parallelGroup`.
    - `exclude_groups`: leave these groups out; ungrouped checkpoints are KEPT; `[]`
      excludes nothing.
    - `statuses`: `status IN (…)`; `[]` matches nothing.
    - `name_prefixes`: name starts with any (exact, case-sensitive); `[]` matches nothing.
    - `offset` / `limit`: applied after filtering and ordering by seq; absent = 0 /
      unbounded; negative values count as 0.
    """

    group: str | None = None
    exclude_groups: Sequence[str] | None = None
    statuses: Sequence[CheckpointStatus] | None = None
    name_prefixes: Sequence[str] | None = None
    offset: int | None = None
    limit: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.group is not None:
            out["group"] = self.group
        if self.exclude_groups is not None:
            out["excludeGroups"] = list(self.exclude_groups)
        if self.statuses is not None:
            out["statuses"] = list(self.statuses)
        if self.name_prefixes is not None:
            out["namePrefixes"] = list(self.name_prefixes)
        if self.offset is not None:
            out["offset"] = self.offset
        if self.limit is not None:
            out["limit"] = self.limit
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckpointQuery:
        """From the camelCase form; snake_case keys are accepted too."""

        def get(camel: str, snake: str) -> Any:
            return data[camel] if camel in data else data.get(snake)

        def seq(value: Any) -> tuple[Any, ...] | None:
            return None if value is None else tuple(value)

        offset, limit = data.get("offset"), data.get("limit")
        return cls(
            group=data.get("group"),
            exclude_groups=seq(get("excludeGroups", "exclude_groups")),
            statuses=seq(data.get("statuses")),
            name_prefixes=seq(get("namePrefixes", "name_prefixes")),
            offset=None if offset is None else int(offset),
            limit=None if limit is None else int(limit),
        )


def as_checkpoint_query(query: CheckpointQuery | Mapping[str, Any] | None) -> CheckpointQuery:
    """A `CheckpointQuery` from itself, its JSON (camelCase) mapping, or None (no filter)."""
    if query is None:
        return CheckpointQuery()
    if isinstance(query, CheckpointQuery):
        return query
    return CheckpointQuery.from_json(query)


# Offsets and limits are clamped below 2^53 (JavaScript's safe integers): larger values
# would overflow SQL integer parameters (SQLite and PostgreSQL BIGINT stop at 2^63 - 1) and
# mean "past every row" anyway (found by tests/read/test_store_path.py).
MAX_PAGE_BOUND = 2**53 - 1


def page_bounds(query: CheckpointQuery) -> tuple[int, int | None]:
    """`(offset, limit)` of a query: offset ≥ 0 (absent = 0); limit ≥ 0 or None (unbounded);
    both at most `MAX_PAGE_BOUND`."""
    offset = min(max(int(query.offset), 0), MAX_PAGE_BOUND) if query.offset is not None else 0
    limit = min(max(int(query.limit), 0), MAX_PAGE_BOUND) if query.limit is not None else None
    return offset, limit


def checkpoint_filter(query: CheckpointQuery) -> Callable[[StepCheckpoint], bool]:
    """The filters of `query` (not its paging) as a predicate over one checkpoint."""
    group = query.group
    excluded = frozenset(query.exclude_groups or ())
    statuses = None if query.statuses is None else frozenset(query.statuses)
    prefixes = None if query.name_prefixes is None else tuple(query.name_prefixes)

    def keep(cp: StepCheckpoint) -> bool:
        if group is not None and cp.parallel_group != group:
            return False
        if excluded and cp.parallel_group is not None and cp.parallel_group in excluded:
            return False
        if statuses is not None and cp.status not in statuses:
            return False
        return prefixes is None or cp.name.startswith(prefixes)

    return keep


def query_checkpoints_of(
    checkpoints: Iterable[StepCheckpoint], query: CheckpointQuery | Mapping[str, Any] | None
) -> list[StepCheckpoint]:
    """Sort by seq, apply the filters, then `offset`/`limit`."""
    q = as_checkpoint_query(query)
    keep = checkpoint_filter(q)
    rows = [cp for cp in sorted(checkpoints, key=lambda cp: cp.seq) if keep(cp)]
    offset, limit = page_bounds(q)
    return rows[offset:] if limit is None else rows[offset : offset + limit]


def checkpoint_stats_of(
    checkpoints: Iterable[StepCheckpoint], group: str | None = None
) -> list[CheckpointStat]:
    """Bucket by `(parallelGroup or None, status, name_kind)` (only `group`'s
    checkpoints when it is given) and aggregate each bucket. Names compare by code point.
    Buckets come back ordered by `min_seq` (callers must not depend on any order)."""
    buckets: dict[tuple[str | None, str, NameKind], list[StepCheckpoint]] = {}
    for cp in checkpoints:
        if group is not None and cp.parallel_group != group:
            continue
        key = (cp.parallel_group, cp.status, name_kind(cp.name))
        buckets.setdefault(key, []).append(cp)
    stats = [
        CheckpointStat(
            group=grp,
            status=cast(CheckpointStatus, status),
            name_kind=kind,
            count=len(rows),
            min_seq=min(cp.seq for cp in rows),
            max_seq=max(cp.seq for cp in rows),
            min_name=min(cp.name for cp in rows),
            max_name=max(cp.name for cp in rows),
            min_enqueued_at=min(cp.enqueued_at or cp.started_at for cp in rows),
            min_started_at=min(cp.started_at for cp in rows),
            max_started_at=max(cp.started_at for cp in rows),
            max_finished_at=max(cp.finished_at for cp in rows),
            sum_attempts=sum(cp.attempts for cp in rows),
        )
        for (grp, status, kind), rows in buckets.items()
    ]
    stats.sort(key=lambda s: s.min_seq)
    return stats


__all__ = [
    "NAME_KINDS",
    "CheckpointQuery",
    "CheckpointStat",
    "NameKind",
    "as_checkpoint_query",
    "checkpoint_filter",
    "checkpoint_stats_of",
    "name_kind",
    "page_bounds",
    "query_checkpoints_of",
    "stat_sort_key",
]
