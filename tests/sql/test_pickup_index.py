"""The pick-up index (schema version 4): pending runs ordered by priority (higher first; NULL
counts as 0), then created_at, id — on SQLite and PostgreSQL.

- Both databases state the index with the same key, and a fresh schema has no trace of the
  older (status, created_at, id) index it replaced.
- The claim walks that index: no sort step in its plans (one per namespace shape), so a
  claim reads the rows it takes instead of sorting the whole backlog.
- A database at version 3 with runs in it upgrades to 4 keeping its runs, which are then
  claimed in the new order.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from durably._store.sql import SqlStateStore, current_version
from durably._store.sql.dialect import create_engine
from durably._store.sql.migrations import HEAD, render
from durably._store.sql.statements import Statements
from tests.pg_support import fresh_schema, schema_url

from .conftest import at, make_run, open_store, sqlite_url
from .test_schema import index_keys

T = TypeVar("T")

PICKUP_KEY = "status, coalesce(priority, 0) desc, created_at, id"
NOW = 1_000_000


async def on_db(store: SqlStateStore, fn: Callable[[sa.Connection], T]) -> T:
    """`fn` on a connection of the store's own database, committed."""
    async with store.engine.begin() as conn:
        return await conn.run_sync(fn)


def test_the_pickup_index_is_migration_4() -> None:
    # Another migration may follow; this one must keep its number.
    assert HEAD >= 4
    for dialect in ("sqlite", "postgresql"):
        v4 = render(dialect, 3, 4)
        assert v4[1] == (
            "CREATE INDEX IF NOT EXISTS durable_workflow_runs_pickup_idx"
            f" ON durable_workflow_runs ({PICKUP_KEY.replace('desc', 'DESC')})"
        )
        assert v4[2] == "DROP INDEX IF EXISTS durable_workflow_runs_status_created_idx"
        assert v4[-1].startswith("INSERT INTO durable_schema_version") and "(4," in v4[-1]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_the_database_states_the_pickup_key(kind: str, tmp_path: Path) -> None:
    async with open_store(kind, tmp_path / "k.db") as store:
        keys = await on_db(store, lambda conn: index_keys(conn, "durable_workflow_runs"))
    assert keys["durable_workflow_runs_pickup_idx"] == PICKUP_KEY
    assert "durable_workflow_runs_status_created_idx" not in keys


async def _fill(store: SqlStateStore, pending: int, done: int) -> None:
    """A backlog among many finished runs, so a plan that sorts or scans stands out."""
    for start in range(0, pending + done, 500):
        batch = []
        for i in range(start, min(start + 500, pending + done)):
            status = "pending" if i < pending else "completed"
            prio = None if i % 3 == 0 else i % 7 - 3
            batch.append(make_run(f"r{i:06d}", status=status, priority=prio, created_at=at(i)))
        await store.create_runs(batch)


def _plan_sqlite(conn: sa.Connection, stmt: Any, params: dict[str, Any]) -> list[str]:
    compiled = stmt.compile(dialect=conn.dialect)
    positional = [params.get(name, 0) for name in compiled.positiontup or ()]
    rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + str(compiled), tuple(positional)).all()
    return [str(row[3]) for row in rows]


def _plan_postgres(conn: sa.Connection, stmt: Any, params: dict[str, Any]) -> list[str]:
    # The store's statements use bind parameters: the generic plan (what a prepared statement
    # settles on after a few executions) is the one to check, so the statement is PREPAREd
    # and EXPLAINed with the generic plan forced.
    compiled = stmt.compile(dialect=conn.dialect)
    names = list(compiled.positiontup or ())
    values = ", ".join(_literal(params.get(name, 0)) for name in names)
    conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
    conn.exec_driver_sql(f"PREPARE pickup_plan AS {compiled}")
    try:
        rows = conn.exec_driver_sql(f"EXPLAIN EXECUTE pickup_plan({values})").all()
    finally:
        conn.exec_driver_sql("DEALLOCATE pickup_plan")
    return [str(row[0]) for row in rows]


def _literal(value: Any) -> str:
    return str(value) if isinstance(value, int) else "'" + str(value).replace("'", "''") + "'"


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_claims_read_the_backlog_in_index_order(kind: str, tmp_path: Path) -> None:
    async with open_store(kind, tmp_path / "p.db") as store:
        await _fill(store, pending=300, done=3000)
        await on_db(store, lambda conn: conn.exec_driver_sql("ANALYZE"))
        q = Statements(store.dialect)
        params = {"w_owner": "a", "w_until": NOW, "w_now": NOW, "lim": 10, "ns": "beta"}
        params["status_1"] = "pending"
        plan = _plan_sqlite if kind == "sqlite" else _plan_postgres
        for stmt in q.claim_pending:
            lines = await on_db(store, lambda conn, stmt=stmt: plan(conn, stmt, params))
            text = "\n".join(lines)
            assert "durable_workflow_runs_pickup_idx" in text, text
            assert not re.search(r"TEMP B-TREE|\bSort\b", text), text
        # and the order is the promised one
        claimed = await store.claim_pending_runs("a", NOW + 1, NOW, 5)
    assert [(r.priority or 0) for r in claimed] == [3, 3, 3, 3, 3]
    assert [r.id for r in claimed] == sorted(r.id for r in claimed)


async def test_a_version_3_database_upgrades_and_keeps_its_runs(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    engine = create_engine(sqlite_url(path))
    try:
        async with engine.begin() as conn:
            for statement in render("sqlite", 0, 3):
                await conn.exec_driver_sql(statement)
        assert await current_version(engine) == 3
    finally:
        await engine.dispose()
    # Rows written by a version-3 durably (the column existed from the start).
    old = SqlStateStore.from_url(sqlite_url(path))
    try:
        await old.create_run(make_run("old", status="pending", created_at=at(1)))
        await old.create_run(make_run("urgent", status="pending", priority=2, created_at=at(2)))
    finally:
        await old.close()
    async with open_store("sqlite", path) as store:  # ensure_schema upgrades to HEAD
        assert await current_version(sqlite_url(path)) == HEAD
        keys = await on_db(store, lambda conn: index_keys(conn, "durable_workflow_runs"))
        claimed = await store.claim_pending_runs("a", NOW + 1, NOW, 10)
    assert keys["durable_workflow_runs_pickup_idx"] == PICKUP_KEY
    assert "durable_workflow_runs_status_created_idx" not in keys
    assert [r.id for r in claimed] == ["urgent", "old"]


async def test_a_version_3_database_upgrades_on_postgresql() -> None:
    async with fresh_schema() as schema:
        url = schema_url(schema)
        engine = create_engine(url)
        try:
            async with engine.begin() as conn:
                for statement in render("postgresql", 0, 3):
                    await conn.exec_driver_sql(statement)
        finally:
            await engine.dispose()
        assert await current_version(url) == 3
        store = SqlStateStore.from_url(url)
        try:
            await store.create_run(make_run("old", status="pending", created_at=at(1)))
            await store.create_run(make_run("neg", status="pending", priority=-1, created_at=at(0)))
            await store.ensure_schema()
            assert await current_version(url) == HEAD
            keys = await on_db(store, lambda conn: index_keys(conn, "durable_workflow_runs"))
            claimed = await store.claim_pending_runs("a", NOW + 1, NOW, 10)
        finally:
            await store.close()
    assert keys["durable_workflow_runs_pickup_idx"] == PICKUP_KEY
    assert "durable_workflow_runs_status_created_idx" not in keys
    assert [r.id for r in claimed] == ["old", "neg"]
