"""The workers' heartbeat rows in SQL (migration 8): `durable_worker_beats`.

One row per `(namespace, instance_id)`, upserted by its worker every few seconds (one
statement), read by starts by name and by the read side (one indexed range read, bounded),
deleted when the worker closes and pruned when they went silent long ago. What a row means
and how an untrusted one is read is `durably._core.worker_beats`.

Kept apart from the store module because the migrations import it, and the store imports the
migrations.
"""

from __future__ import annotations

import sqlalchemy as sa

from durably._core.worker_beats import ALL_NAMESPACES, WorkerBeat, beat_from_row, beat_info_json
from durably._store.sql.dialect import SqlDialect
from durably._store.sql.runner import StatementRunner
from durably._store.sql.schema import worker_beats

__all__ = ["SqlWorkerBeats", "migration_v8"]

_V8 = """
CREATE TABLE IF NOT EXISTS durable_worker_beats (
  namespace    TEXT NOT NULL,
  instance_id  TEXT NOT NULL,
  beat_at      BIGINT NOT NULL,
  started_at   BIGINT NOT NULL,
  info         TEXT NOT NULL,
  PRIMARY KEY (namespace, instance_id)
);
CREATE INDEX IF NOT EXISTS durable_worker_beats_beat_at_idx
  ON durable_worker_beats (beat_at)
"""


def migration_v8(dialect_name: str) -> list[str]:
    """The same table on every dialect (frozen: a published migration never changes)."""
    return [s.strip() for s in _V8.split(";") if s.strip()]


class SqlWorkerBeats:
    """`FleetStore` over SQL: each method one statement."""

    def __init__(self, runner: StatementRunner, dialect: SqlDialect) -> None:
        self._runner = runner
        self._upsert = dialect.upsert(worker_beats, ("namespace", "instance_id"))

    async def beat_worker(self, beat: WorkerBeat) -> None:
        await self._runner.write(
            self._upsert,
            {
                "namespace": beat.namespace,
                "instance_id": beat.instance_id,
                "beat_at": beat.beat_at,
                "started_at": beat.started_at,
                "info": beat_info_json(beat),
            },
        )

    async def list_worker_beats(
        self, namespace: str | None, since_ms: int, limit: int
    ) -> list[WorkerBeat]:
        c = worker_beats.c
        stmt = sa.select(c.namespace, c.instance_id, c.beat_at, c.started_at, c.info).where(
            c.beat_at >= since_ms
        )
        if namespace is not None:
            stmt = stmt.where(c.namespace.in_([namespace, ALL_NAMESPACES]))
        stmt = stmt.order_by(c.beat_at.desc(), c.namespace, c.instance_id).limit(max(limit, 0))
        found = (beat_from_row(*row) for row in await self._runner.read_all(stmt))
        return [beat for beat in found if beat is not None]

    async def forget_worker(self, namespace: str, instance_id: str) -> None:
        c = worker_beats.c
        await self._runner.write(
            sa.delete(worker_beats).where(c.namespace == namespace, c.instance_id == instance_id)
        )

    async def prune_worker_beats(self, before_ms: int) -> int:
        return await self._runner.write(
            sa.delete(worker_beats).where(worker_beats.c.beat_at < before_ms)
        )
