"""What the schedule acceptance tests share: a test clock, a store per test (a SQLite file or
a fresh PostgreSQL schema) and a log of the order in which run rows were inserted.

The insert log is a table filled by a database trigger on the runs table, read with plain SQL
(sqlite3, asyncpg), so the order of a tick's starts is checked independently of durably (the
runs' `created_at` comes from the test clock, which does not move within a tick).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durably import Engine, RunQuery
from tests.pg_support import connect, fresh_schema, schema_url

MIN = 60_000
FAST: dict[str, Any] = {"timer_poll_ms": 20, "lease_ms": 2000, "drain_timeout_ms": 2000}


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


_SQLITE_LOG = """
CREATE TABLE sched_insert_log (n INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL);
CREATE TRIGGER sched_insert_log_tr AFTER INSERT ON durable_workflow_runs
BEGIN INSERT INTO sched_insert_log (run_id) VALUES (NEW.id); END;
"""

_PG_LOG = """
CREATE TABLE "{s}".sched_insert_log (n BIGSERIAL PRIMARY KEY, run_id TEXT NOT NULL);
CREATE FUNCTION "{s}".sched_insert_log_fn() RETURNS trigger AS $$
BEGIN
    INSERT INTO "{s}".sched_insert_log (run_id) VALUES (NEW.id);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER sched_insert_log_tr AFTER INSERT ON "{s}".durable_workflow_runs
    FOR EACH ROW EXECUTE FUNCTION "{s}".sched_insert_log_fn();
"""


@dataclass(frozen=True)
class Store:
    kind: str
    url: str
    path: Path | None = None  # the SQLite file
    schema: str | None = None  # the PostgreSQL schema

    async def install_insert_log(self) -> None:
        """From now on, every inserted run row appends its id to `sched_insert_log` (call
        once the store's tables exist)."""
        if self.path is not None:
            with sqlite3.connect(self.path) as db:
                db.executescript(_SQLITE_LOG)
            return
        conn = await connect()
        try:
            await conn.execute(_PG_LOG.format(s=self.schema))
        finally:
            await conn.close()

    async def inserted(self) -> list[str]:
        """The run ids inserted since `install_insert_log`, in insertion order."""
        if self.path is not None:
            with sqlite3.connect(self.path) as db:
                rows = db.execute("SELECT run_id FROM sched_insert_log ORDER BY n").fetchall()
            return [row[0] for row in rows]
        conn = await connect()
        try:
            found = await conn.fetch(
                f'SELECT run_id FROM "{self.schema}".sched_insert_log ORDER BY n'
            )
        finally:
            await conn.close()
        return [row["run_id"] for row in found]


@pytest.fixture(params=["sqlite", "postgres"], name="sched_store")
async def sched_store_fixture(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Store]:
    if request.param == "sqlite":
        path = tmp_path / "sched.db"
        yield Store("sqlite", f"sqlite:///{path}", path=path)
        return
    async with fresh_schema() as schema:
        yield Store("postgres", schema_url(schema), schema=schema)


async def run_ids(engine: Engine, workflow: str) -> list[str]:
    runs = await engine.store.list_runs(RunQuery(workflow=workflow))
    return sorted(r.id for r in runs)


async def exists(engine: Engine, run_id: str) -> bool:
    return await engine.store.get_run(run_id) is not None


async def live(engine: Engine, run_id: str) -> bool:
    run = await engine.store.get_run(run_id)
    return run is not None and run.status == "suspended"


async def finished(engine: Engine, run_id: str) -> bool:
    run = await engine.store.get_run(run_id)
    return run is not None and run.is_terminal


async def all_finished(engine: Engine, workflow: str) -> bool:
    runs = await engine.store.list_runs(RunQuery(workflow=workflow))
    return all(r.is_terminal for r in runs)
