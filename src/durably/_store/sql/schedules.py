"""Persisted schedules in SQL (migration 9): `durable_schedules`.

One row per schedule: the queryable columns and the `spec` / `state` JSON documents of
`durably._core.schedules`. Every method is one statement; the compare-and-set write is an
`UPDATE … WHERE id = ? AND updated_at = ?` whose row count is the answer, so of two engines
advancing a record from the same read exactly one wins. The due scan reads the index
`(namespace, paused, next_fire_at)`.

Kept apart from the store module because the migrations import it, and the store imports the
migrations.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from durably._core.schedules import (
    ScheduleQuery,
    ScheduleRecord,
    check_put,
    check_query,
    record_from_row,
    spec_json,
    state_json,
)
from durably._store.sql.dialect import SqlDialect
from durably._store.sql.runner import StatementRunner
from durably._store.sql.schema import schedules

__all__ = ["SqlSchedules", "migration_v9"]

_V9 = """
CREATE TABLE IF NOT EXISTS durable_schedules (
  id            TEXT NOT NULL,
  workflow      TEXT NOT NULL,
  namespace     TEXT NOT NULL DEFAULT 'default',
  paused        {boolean} NOT NULL,
  next_fire_at  BIGINT,
  created_at    BIGINT NOT NULL,
  updated_at    BIGINT NOT NULL,
  spec          TEXT NOT NULL,
  state         TEXT,
  PRIMARY KEY (id)
);
CREATE INDEX IF NOT EXISTS durable_schedules_due_idx
  ON durable_schedules (namespace, paused, next_fire_at)
"""


def migration_v9(dialect_name: str) -> list[str]:
    """The schedules table (frozen: a published migration never changes). Booleans are
    INTEGER 0/1 on SQLite, as SQLite has no boolean type."""
    boolean = "INTEGER" if dialect_name == "sqlite" else "BOOLEAN"
    return [s.strip() for s in _V9.format(boolean=boolean).split(";") if s.strip()]


_COLUMNS = (
    schedules.c.id,
    schedules.c.workflow,
    schedules.c.namespace,
    schedules.c.paused,
    schedules.c.next_fire_at,
    schedules.c.created_at,
    schedules.c.updated_at,
    schedules.c.spec,
    schedules.c.state,
)


def _values(record: ScheduleRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "workflow": record.workflow,
        "namespace": record.namespace,
        "paused": bool(record.paused),
        "next_fire_at": record.next_fire_at,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "spec": spec_json(record),
        "state": state_json(record),
    }


class SqlSchedules:
    """`ScheduleStore` over SQL: each method one statement."""

    def __init__(self, runner: StatementRunner, dialect: SqlDialect) -> None:
        self._runner = runner
        self._upsert = dialect.upsert(schedules, ("id",))
        self._insert_new = dialect.insert_ignore(schedules, ("id",))

    async def put_schedule(
        self,
        record: ScheduleRecord,
        *,
        if_absent: bool = False,
        expected_updated_at: int | None = None,
    ) -> bool:
        check_put(record, if_absent, expected_updated_at)
        values = _values(record)
        if if_absent:
            return await self._runner.write(self._insert_new, values) == 1
        if expected_updated_at is not None:
            c = schedules.c
            changed = {k: v for k, v in values.items() if k != "id"}
            stmt = (
                sa.update(schedules)
                .where(c.id == record.id, c.updated_at == expected_updated_at)
                .values(**changed)
            )
            return await self._runner.write(stmt) == 1
        await self._runner.write(self._upsert, values)
        return True

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        row = await self._runner.read_first(
            sa.select(*_COLUMNS).where(schedules.c.id == schedule_id)
        )
        return None if row is None else record_from_row(*row)

    async def delete_schedule(self, schedule_id: str) -> bool:
        deleted = await self._runner.write(
            sa.delete(schedules).where(schedules.c.id == schedule_id)
        )
        return deleted > 0

    async def list_schedules(self, query: ScheduleQuery) -> list[ScheduleRecord]:
        check_query(query)
        c = schedules.c
        stmt = sa.select(*_COLUMNS)
        if query.workflow is not None:
            stmt = stmt.where(c.workflow == query.workflow)
        if query.namespace is not None:
            stmt = stmt.where(c.namespace == query.namespace)
        if query.paused is not None:
            stmt = stmt.where(c.paused == query.paused)
        if query.due_before is not None:
            stmt = stmt.where(c.next_fire_at.is_not(None), c.next_fire_at <= query.due_before)
        stmt = (
            stmt.order_by(c.next_fire_at.is_(None), c.next_fire_at, c.id)
            .limit(query.limit)
            .offset(query.offset)
        )
        return [record_from_row(*row) for row in await self._runner.read_all(stmt)]
