"""Run facets of the SQL store, SQLite and PostgreSQL.

Each call is ONE statement, filtered in SQL by the shared predicate builder
(`run_query_predicates`: tags and search attributes as correlated `EXISTS` over
`durable_run_tags` / `durable_run_attributes`), so no run row crosses the wire:

- `run_facets`: `SELECT status, origin, count(*) … GROUP BY status, origin` over every
  matching run (`RunFacetQuery`: status/origin predicates and the page are dropped);
- `run_value_facets`, column axes (`workflow`, `status`, `origin`, `namespace`): exact
  `GROUP BY <column>` over every matching run (`scan` ignored);
- `run_value_facets`, `tag` / `attributeKey` / `attributeValue(key)`: `GROUP BY` over the side
  table, restricted to the newest `scan` (5000) matching runs (`run_id IN (SELECT id … ORDER
  BY created_at DESC, id DESC LIMIT :scan)`), the same window the in-memory reference counts,
  so both store families agree exactly. Attribute values are formatted with `js_string` in
  Python, never in SQL.
- `run_activity`: two `GROUP BY`s by time bucket — starts over `created_at`, settled runs
  over `(status, updated_at)` — both on indexed columns and bounded by the window;
- `lease_owners`: `GROUP BY namespace, locked_by` over unexpired leases — what
  `worker_health` reads in place of a heartbeat table.

Every answer is piped through the shared merges (`merge_run_facet_rows`,
`merge_run_value_facet_rows`), which fold blank origins and order/limit value rows.
`facet_rows_read` (durably test hook, read through the store) counts the rows the
`GROUP BY`s sent back.

A part object of `SqlStateStore` (which forwards the three contract methods to it): it is
given only the store's `StatementRunner`, since its statements are built per call from the
shared predicate builder and read the same way on both databases.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import sqlalchemy as sa

from durably._core.models import RunQuery
from durably._core.run_activity import ActivityBucket, ActivityWindow, merge_activity
from durably._core.run_facets import (
    LeaseOwnerRow,
    RunFacetRow,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    facet_origin,
    facet_query,
    js_string,
    merge_run_facet_rows,
    merge_run_value_facet_rows,
    unpaged,
)
from durably._store.query import DEFAULT_NAMESPACE
from durably._store.sql.predicates import namespace_predicate, run_query_predicates
from durably._store.sql.runner import StatementRunner
from durably._store.sql.schema import attributes, runs, tags

# A constant in the SQL text (no bind), so the same expression in SELECT and GROUP BY reads
# identically on PostgreSQL (two binds `$1`/`$2` would not be "the same expression").
_DEFAULT_NS: sa.ColumnElement[str] = sa.literal_column("'" + DEFAULT_NAMESPACE + "'")


def _namespace_column() -> sa.ColumnElement[Any]:
    return sa.func.coalesce(runs.c.namespace, _DEFAULT_NS)


def run_facets_statement(query: RunQuery) -> sa.Select[Any]:
    r = runs.c
    return (
        sa.select(r.status, r.origin, sa.func.count())
        .where(*run_query_predicates(facet_query(query)))
        .group_by(r.status, r.origin)
        .order_by(r.status, r.origin)
    )


def _column_axis(field: str) -> sa.ColumnElement[Any]:
    if field == "namespace":
        return _namespace_column()
    return runs.c[field]


def scan_window(query: RunQuery, scan: int) -> sa.Select[Any]:
    """Ids of the newest `scan` runs matching `query` (list order)."""
    r = runs.c
    return (
        sa.select(r.id)
        .where(*run_query_predicates(unpaged(query)))
        .order_by(r.created_at.desc(), r.id.desc())
        .limit(max(int(scan), 0))
    )


def run_value_facets_statement(
    axis: RunValueAxis, query: RunQuery, opts: RunValueFacetOptions
) -> sa.Select[Any]:
    """One `GROUP BY` for `axis`; rows are `(value, count)` except for `attributeValue`,
    whose rows are `(str_value, num_value, count)`."""
    if axis.field in ("workflow", "status", "origin", "namespace"):
        column = _column_axis(axis.field)
        return (
            sa.select(column, sa.func.count())
            .where(*run_query_predicates(unpaged(query)))
            .group_by(column)
        )
    window = scan_window(query, opts.effective_scan)
    if axis.field == "tag":
        return (
            sa.select(tags.c.tag, sa.func.count())
            .where(tags.c.run_id.in_(window))
            .group_by(tags.c.tag)
        )
    a = attributes.c
    if axis.field == "attributeKey":
        return sa.select(a.key, sa.func.count()).where(a.run_id.in_(window)).group_by(a.key)
    return (
        sa.select(a.str_value, a.num_value, sa.func.count())
        .where(a.key == axis.key, a.run_id.in_(window))
        .group_by(a.str_value, a.num_value)
    )


def _bucket_of(column: sa.ColumnElement[int], window: ActivityWindow) -> sa.ColumnElement[int]:
    # The window's numbers are checked ints, written into the SQL text: the same expression
    # in SELECT and GROUP BY then reads identically on PostgreSQL (binds would not). `//` is
    # integer division on both databases; both operands are non-negative in the window.
    since: sa.ColumnElement[int] = sa.literal_column(str(int(window.since_ms)), sa.BigInteger)
    width: sa.ColumnElement[int] = sa.literal_column(str(int(window.bucket_ms)), sa.BigInteger)
    return ((column - since) // width).label("bucket")


def run_activity_statements(
    query: RunQuery, window: ActivityWindow
) -> tuple[sa.Select[Any], sa.Select[Any]]:
    """Starts per bucket (`created_at` in the window) and settled runs per bucket and status
    (`status` completed/failed, `updated_at` in the window): `(bucket, count)` and
    `(bucket, status, count)` rows: at most one, and two, per bucket."""
    r = runs.c
    where = run_query_predicates(unpaged(query))
    created = _bucket_of(r.created_at, window)
    started = cast(
        "sa.Select[Any]",
        sa.select(created, sa.func.count())
        .where(*where, r.created_at >= window.since_ms, r.created_at < window.until_ms)
        .group_by(sa.literal_column("bucket")),
    )
    updated = _bucket_of(r.updated_at, window)
    settled = (
        sa.select(updated, r.status, sa.func.count())
        .where(
            *where,
            r.status.in_(["completed", "failed"]),
            r.updated_at >= window.since_ms,
            r.updated_at < window.until_ms,
        )
        .group_by(sa.literal_column("bucket"), r.status)
    )
    return started, settled


def lease_owners_statement(now_ms: int, namespace: str | None) -> sa.Select[Any]:
    r = runs.c
    ns = _namespace_column()
    where: list[sa.ColumnElement[bool]] = [r.locked_by.is_not(None), r.locked_until > now_ms]
    pred = namespace_predicate(namespace)
    if pred is not None:
        where.append(pred)
    return (
        sa.select(ns, r.locked_by, sa.func.count(), sa.func.max(r.locked_until))
        .where(*where)
        .group_by(ns, r.locked_by)
    )


def _value_rows(axis: RunValueAxis, found: Sequence[Sequence[Any]]) -> list[tuple[str | None, int]]:
    if axis.field == "origin":  # NULL, '' and blanks are the one unattributed bucket
        return [(facet_origin(row[0]), int(row[1])) for row in found]
    if axis.field != "attributeValue":
        return [(row[0], int(row[1])) for row in found]
    out: list[tuple[str | None, int]] = []
    for str_value, num_value, count in found:
        value = str_value if str_value is not None else js_string(float(num_value))
        out.append((value, int(count)))
    return out


class SqlRunFacets:
    """Run facets and lease owners: one `GROUP BY` each."""

    def __init__(self, runner: StatementRunner) -> None:
        self._runner = runner
        #: Test hook: rows the facet `GROUP BY`s sent back since construction.
        self.facet_rows_read = 0

    async def _facet_rows(self, stmt: sa.Executable) -> Sequence[Sequence[Any]]:
        found = await self._runner.read_all(stmt)
        self.facet_rows_read += len(found)
        return found

    async def run_facets(self, query: RunQuery) -> list[RunFacetRow]:
        found = await self._facet_rows(run_facets_statement(query))
        return merge_run_facet_rows((row[0], row[1], int(row[2])) for row in found)

    async def run_value_facets(
        self,
        axis: RunValueAxis | Mapping[str, Any] | str,
        query: RunQuery,
        opts: RunValueFacetOptions | Mapping[str, Any] | None = None,
    ) -> list[RunValueFacetRow]:
        ax = RunValueAxis.of(axis)
        options = RunValueFacetOptions.of(opts)
        found = await self._facet_rows(run_value_facets_statement(ax, query, options))
        return merge_run_value_facet_rows(_value_rows(ax, found), options)

    async def run_activity(self, query: RunQuery, window: ActivityWindow) -> list[ActivityBucket]:
        started_stmt, settled_stmt = run_activity_statements(query, window)
        started = await self._facet_rows(started_stmt)
        settled = await self._facet_rows(settled_stmt)
        return merge_activity(
            window,
            ((int(row[0]), int(row[1])) for row in started),
            ((int(row[0]), str(row[1]), int(row[2])) for row in settled),
        )

    async def lease_owners(self, now_ms: int, namespace: str | None = None) -> list[LeaseOwnerRow]:
        found = await self._facet_rows(lease_owners_statement(now_ms, namespace))
        rows = [
            LeaseOwnerRow(namespace=str(ns), owner=str(owner), runs=int(n), lease_until=int(until))
            for ns, owner, n, until in found
        ]
        return sorted(rows, key=lambda row: (row.namespace, row.owner))


__all__ = [
    "SqlRunFacets",
    "lease_owners_statement",
    "run_activity_statements",
    "run_facets_statement",
    "run_value_facets_statement",
    "scan_window",
]
