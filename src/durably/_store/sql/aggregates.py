"""Checkpoint aggregates of the SQL store, SQLite and PostgreSQL.

- `checkpoint_stats` is ONE prebuilt `GROUP BY` statement (`Statements.cp_stats*`, built by
  `stats_statements.checkpoint_stats_statements`): it reads no payload column and sends
  back one row per bucket, however many checkpoints the run has.
- `query_checkpoints` filters, orders and pages in SQL (`query_checkpoints_statement`).

Agreement with the in-memory reference (`checkpoint_stats_of`, `query_checkpoints_of`):
- the name-kind `CASE` mirrors `checkpoint_name_kind`, on `substr` (exact and
  case-sensitive, never LIKE);
- `MIN(name)`/`MAX(name)` compare by code point: SQLite's default BINARY collation already
  does (UTF-8 byte order); PostgreSQL takes `COLLATE "C"` so a database created with a
  linguistic collation (`en_US.UTF-8` ignores punctuation at the first level) agrees too;
- `enqueued_at` NULL (an old row) is read as `started_at`, as `list_checkpoints` reads it.

Test hooks, mirroring the in-memory store's: `checkpoint_rows_read` (cumulative)
and `last_checkpoint_rows_read` count the rows `query_checkpoints` returned;
`checkpoint_stats` returns no checkpoint rows and adds nothing there.
`checkpoint_stats_rows_read` counts the rows the `GROUP BY` sent back (one per
bucket), which is what proves a 40 000-row run's stats cost O(buckets) rows on the wire.
`count_checkpoint_rows(n)` is there for the store's other checkpoint reads; the counters are
this object's and the store reads them from here.

A part object of `SqlStateStore` (which forwards the two contract methods to it), given
what it uses: the store's `StatementRunner`, its prebuilt `Statements` and its `SqlDialect`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import sqlalchemy as sa

from durably._core.aggregates import (
    CheckpointQuery,
    CheckpointStat,
    NameKind,
    as_checkpoint_query,
    page_bounds,
)
from durably._core.models import CheckpointStatus, StepCheckpoint, utc_from_ms
from durably._store.sql import rows as _rows
from durably._store.sql.dialect import SqlDialect
from durably._store.sql.runner import StatementRunner
from durably._store.sql.schema import CHECKPOINT_COLUMNS, checkpoints
from durably._store.sql.statements import Statements


def stat_from_row(row: Sequence[Any]) -> CheckpointStat:
    return CheckpointStat(
        group=row[0],
        status=cast(CheckpointStatus, row[1]),
        name_kind=cast(NameKind, row[2]),
        count=int(row[3]),
        min_seq=int(row[4]),
        max_seq=int(row[5]),
        min_name=str(row[6]),
        max_name=str(row[7]),
        min_enqueued_at=utc_from_ms(int(row[8])),
        min_started_at=utc_from_ms(int(row[9])),
        max_started_at=utc_from_ms(int(row[10])),
        max_finished_at=utc_from_ms(int(row[11])),
        sum_attempts=int(row[12] or 0),
    )


def query_checkpoints_statement(
    dialect: SqlDialect, run_id: str, query: CheckpointQuery
) -> sa.Select[Any] | None:
    """The `SELECT … ORDER BY seq LIMIT … OFFSET …`; None when the query
    can match nothing (`statuses=[]`, `name_prefixes=[]`, `limit=0`): no statement needed."""
    c = checkpoints.c
    where: list[sa.ColumnElement[bool]] = [c.run_id == run_id]
    if query.group is not None:
        where.append(c.parallel_group == query.group)
    if query.exclude_groups:
        excluded = list(dict.fromkeys(query.exclude_groups))
        where.append(sa.or_(c.parallel_group.is_(None), c.parallel_group.not_in(excluded)))
    if query.statuses is not None:
        if not query.statuses:
            return None
        where.append(c.status.in_(list(dict.fromkeys(query.statuses))))
    if query.name_prefixes is not None:
        if not query.name_prefixes:
            return None
        prefixes = list(dict.fromkeys(query.name_prefixes))
        matches = [dialect.literal_prefix_predicate(c.name, p) for p in prefixes]
        where.append(matches[0] if len(matches) == 1 else sa.or_(*matches))
    offset, limit = page_bounds(query)
    if limit == 0:
        return None
    stmt = sa.select(*CHECKPOINT_COLUMNS).where(*where).order_by(c.seq)
    if limit is not None:
        stmt = stmt.limit(limit)
    if offset:
        stmt = stmt.offset(offset)
    return stmt


class SqlCheckpointAggregates:
    """`checkpoint_stats` and `query_checkpoints`, and the checkpoint-row counters."""

    def __init__(self, runner: StatementRunner, statements: Statements, dialect: SqlDialect):
        self._runner = runner
        self._q = statements
        self._dialect = dialect
        #: rows returned by checkpoint reads since construction (as the in-memory store
        #: counts them).
        self.checkpoint_rows_read = 0
        #: rows returned by the last counted checkpoint read.
        self.last_checkpoint_rows_read = 0
        #: rows the `checkpoint_stats` GROUP BY sent back (one per bucket), cumulative.
        self.checkpoint_stats_rows_read = 0

    def count_checkpoint_rows(self, n: int, *, last: bool = True) -> None:
        self.checkpoint_rows_read += n
        if last:
            self.last_checkpoint_rows_read = n

    async def checkpoint_stats(self, run_id: str, group: str | None = None) -> list[CheckpointStat]:
        if group is None:
            found = await self._runner.read_all(self._q.cp_stats, {"run_id": run_id})
        else:
            found = await self._runner.read_all(
                self._q.cp_stats_group, {"run_id": run_id, "group": group}
            )
        self.checkpoint_stats_rows_read += len(found)
        return [stat_from_row(row) for row in found]

    async def query_checkpoints(
        self, run_id: str, query: CheckpointQuery | Mapping[str, Any] | None = None
    ) -> list[StepCheckpoint]:
        stmt = query_checkpoints_statement(self._dialect, run_id, as_checkpoint_query(query))
        found = [] if stmt is None else await self._runner.read_all(stmt)
        self.count_checkpoint_rows(len(found))
        return [_rows.checkpoint_from_row(row) for row in found]


__all__ = [
    "SqlCheckpointAggregates",
    "query_checkpoints_statement",
    "stat_from_row",
]
