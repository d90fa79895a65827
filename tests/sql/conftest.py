"""Fixtures for the SQL store tests: real SQLite files under `tmp_path` and real PostgreSQL
schemas (one fresh schema per test), never mocks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from durably._core.models import StepCheckpoint, WorkflowRun
from durably._store.sql import SqlStateStore
from tests.pg_support import fresh_schema, schema_url

T0 = datetime(2026, 6, 11, tzinfo=UTC)


def at(minutes: int = 0, *, ms: int = 0) -> datetime:
    return T0 + timedelta(minutes=minutes, milliseconds=ms)


def make_run(run_id: str = "r1", **kw: Any) -> WorkflowRun:
    fields: dict[str, Any] = {
        "id": run_id,
        "workflow": "checkout",
        "workflow_version": "1",
        "status": "running",
        "input": {"orderId": "o1"},
        "created_at": T0,
        "updated_at": T0,
    }
    fields.update(kw)
    return WorkflowRun(**fields)


def make_cp(run_id: str = "r1", seq: int = 0, **kw: Any) -> StepCheckpoint:
    fields: dict[str, Any] = {
        "run_id": run_id,
        "seq": seq,
        "name": "reserve",
        "kind": "local",
        "step_id": f"{run_id}:{seq}",
        "status": "completed",
        "output": {"ok": True},
        "attempts": 1,
        "started_at": T0,
        "finished_at": T0,
    }
    fields.update(kw)
    return StepCheckpoint(**fields)


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "store.db"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqlStateStore]:
    sql = SqlStateStore.from_url(sqlite_url(db_path))
    await sql.ensure_schema()
    try:
        yield sql
    finally:
        await sql.close()


@asynccontextmanager
async def open_store(kind: str, db_path: Path) -> AsyncIterator[SqlStateStore]:
    """A migrated store: `sqlite` (a file at `db_path`) or `postgres` (a fresh schema,
    dropped afterwards; skipped when PostgreSQL is unreachable, see tests/pg_support.py)."""
    if kind == "sqlite":
        url = sqlite_url(db_path)
        sql = SqlStateStore.from_url(url)
        await sql.ensure_schema()
        try:
            yield sql
        finally:
            await sql.close()
        return
    async with fresh_schema(create=False) as schema:
        sql = SqlStateStore.from_url(schema_url(schema))
        await sql.ensure_schema()
        try:
            yield sql
        finally:
            await sql.close()


#: Override a module's `store` fixture with this (sqlite and postgres), and pin single tests
#: to SQLite with `SQLITE_ONLY`.
BOTH = ["sqlite", "postgres"]
SQLITE_ONLY = pytest.mark.parametrize("store", ["sqlite"], indirect=True)


async def raw(store: SqlStateStore, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Rows of a raw SQL statement (`:name` parameters) run on the store's own database."""
    async with store.engine.connect() as conn:
        result = await conn.execute(sa.text(sql), params)
        rows = [tuple(row) for row in result.all()] if result.returns_rows else []
        await conn.commit()
    return rows


def is_pg(store: SqlStateStore) -> bool:
    return not store.dialect.is_sqlite
