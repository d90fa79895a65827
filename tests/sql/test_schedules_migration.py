"""Migration 9 (`durable_schedules`): a database of the previous version upgrades in place,
keeps its runs, and gets the table with its due index; SQLite stores `paused` as 0/1."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from durably._core.schedules import ScheduleQuery, ScheduleRecord, ScheduleSpec
from durably._store.sql import SqlStateStore, current_version
from durably._store.sql.dialect import create_engine
from durably._store.sql.migrations import HEAD, render
from tests.pg_support import fresh_schema, schema_url

from .conftest import make_run, sqlite_url
from .test_pickup_index import on_db
from .test_schema import index_keys

DUE_KEY = "namespace, paused, next_fire_at"


def record(sid: str, *, paused: bool = False) -> ScheduleRecord:
    return ScheduleRecord(
        id=sid,
        workflow="report",
        paused=paused,
        next_fire_at=60_000,
        created_at=1,
        updated_at=1,
        spec=ScheduleSpec(every_ms=60_000),
    )


async def _old_database(url: str, dialect: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            for statement in render(dialect, 0, 8):
                await conn.exec_driver_sql(statement)
    finally:
        await engine.dispose()
    assert await current_version(url) == 8


async def _upgrade_and_check(url: str) -> None:
    old = SqlStateStore.from_url(url)
    try:
        await old.create_run(make_run("old-run"))
    finally:
        await old.close()
    store = SqlStateStore.from_url(url)
    try:
        await store.ensure_schema()  # upgrades to HEAD
        assert await current_version(url) == HEAD
        assert await store.get_run("old-run") is not None
        keys = await on_db(store, lambda conn: index_keys(conn, "durable_schedules"))
        assert keys["durable_schedules_due_idx"] == DUE_KEY
        assert await store.put_schedule(record("a", paused=True), if_absent=True)
        assert await store.put_schedule(record("b"), if_absent=True)
        due = await store.list_schedules(ScheduleQuery(paused=False, due_before=60_000))
        assert [r.id for r in due] == ["b"]
    finally:
        await store.close()


async def test_a_version_8_sqlite_database_gets_the_schedules_table(tmp_path: Path) -> None:
    path = tmp_path / "v8.db"
    url = sqlite_url(path)
    await _old_database(url, "sqlite")
    await _upgrade_and_check(url)
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT id, paused FROM durable_schedules ORDER BY id").fetchall()
    assert rows == [("a", 1), ("b", 0)]


async def test_a_version_8_postgresql_database_gets_the_schedules_table() -> None:
    async with fresh_schema() as schema:
        url = schema_url(schema)
        await _old_database(url, "postgresql")
        await _upgrade_and_check(url)


def test_migration_9_renders_per_dialect() -> None:
    # Another migration may follow; this one must keep its number.
    assert HEAD >= 9
    sqlite_sql = " ".join(render("sqlite", 8, 9))
    pg_sql = " ".join(render("postgresql", 8, 9))
    assert "paused        INTEGER NOT NULL" in sqlite_sql
    assert "paused        BOOLEAN NOT NULL" in pg_sql
    assert "durable_schedules_due_idx" in pg_sql
