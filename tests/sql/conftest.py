"""Fixtures for the SQL store tests: real SQLite files under `tmp_path` and real PostgreSQL
schemas (one fresh schema per test), never mocks."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from durably._store.sql import SqlStateStore
from durably._store.sql import connection as connection_module
from tests.pg_support import fresh_schema, schema_url
from tests.store.support import T0, at, make_cp, make_run

# The model fixtures of the conformance suite, shared here.
__all__ = ["T0", "Calls", "at", "make_cp", "make_run"]


Calls = list[tuple[int, bool, bool]]  # (ops in the hop, BEGIN in it, COMMIT in it)


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """Every one-hop group of statements the SQLite writer sends to its thread."""
    calls: Calls = []
    real = connection_module._run_ops

    def spy(conn: sqlite3.Connection, ops: Any, begin: bool, commit: bool, in_tx: bool) -> Any:
        calls.append((len(ops), begin, commit))
        return real(conn, ops, begin, commit, in_tx)

    monkeypatch.setattr(connection_module, "_run_ops", spy)
    yield calls


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
