"""A database whose schema was written by a newer durably is refused, and left as it was.

Each test builds a real store (an SQLite file, or a fresh PostgreSQL schema), writes a run into
it, stamps a version newer than this code's `HEAD` into `durable_schema_version` (what a newer
release's migration would leave behind), and then opens it the ways a user does: the store's
`ensure_schema`, an `Engine`, `durably db upgrade` (with and without `--sql`) and a read
command. Every one must fail naming both versions and the remedy, and the tables must be
byte-for-byte what they were.
"""

from __future__ import annotations

import sqlite3
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durably import Engine, SchemaVersionError
from durably._store.sql import SqlStateStore
from durably._store.sql.migrations import HEAD
from tests.cli.support import durably as durably_cli
from tests.pg_support import connect, fresh_schema, schema_url
from tests.store.support import make_run

NEWER = HEAD + 5


@dataclass
class Db:
    kind: str
    url: str
    path: Path | None = None
    schema: str | None = None

    async def stamp(self, version: int) -> None:
        """Record `version` as applied, as a newer durably's migration would."""
        sql = f"INSERT INTO durable_schema_version (version, applied_at) VALUES ({version}, 1)"
        if self.path is not None:
            with sqlite3.connect(self.path) as conn:
                conn.execute(sql)
            return
        conn = await connect()
        try:
            await conn.execute(f'SET search_path TO "{self.schema}"')
            await conn.execute(sql)
        finally:
            await conn.close()

    async def snapshot(self) -> dict[str, Any]:
        """Every table's definition and rows (and the indexes): what must not change."""
        if self.path is not None:
            with sqlite3.connect(self.path) as conn:
                master = conn.execute(
                    "SELECT type, name, sql FROM sqlite_master ORDER BY type, name"
                ).fetchall()
                rows = {
                    name: sorted(conn.execute(f'SELECT * FROM "{name}"').fetchall(), key=repr)
                    for kind, name, _ in master
                    if kind == "table" and not name.startswith("sqlite_")
                }
            return {"master": master, "rows": rows}
        conn = await connect()
        try:
            columns = await conn.fetch(
                "SELECT table_name, column_name, data_type, is_nullable, column_default "
                "FROM information_schema.columns WHERE table_schema = $1 "
                "ORDER BY table_name, ordinal_position",
                self.schema,
            )
            indexes = await conn.fetch(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1 "
                "ORDER BY indexname",
                self.schema,
            )
            tables = sorted({r["table_name"] for r in columns})
            rows = {
                t: sorted(
                    (tuple(r) for r in await conn.fetch(f'SELECT * FROM "{self.schema}"."{t}"')),
                    key=repr,
                )
                for t in tables
            }
        finally:
            await conn.close()
        return {
            "columns": [tuple(c) for c in columns],
            "indexes": [tuple(i) for i in indexes],
            "rows": rows,
        }


@pytest.fixture(params=["sqlite", "postgres"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Db]:
    """A migrated store holding one run, closed again."""
    if request.param == "sqlite":
        path = tmp_path / "newer.db"
        built = Db("sqlite", f"sqlite:///{path}", path=path)
        await _populate(built.url)
        yield built
        return
    async with fresh_schema(create=False) as schema:
        built = Db("postgres", schema_url(schema), schema=schema)
        await _populate(built.url)
        yield built


async def _populate(url: str) -> None:
    store = SqlStateStore.from_url(url)
    try:
        await store.ensure_schema()
        await store.create_run(make_run("kept-run"))
    finally:
        await store.close()


def _assert_names_versions(message: str) -> None:
    assert f"version {NEWER}" in message, message
    assert f"version {HEAD}" in message, message
    assert "Upgrade durably" in message, message
    assert "newer" in message, message


async def test_opening_a_newer_schema_raises_and_changes_nothing(db: Db) -> None:
    await db.stamp(NEWER)
    before = await db.snapshot()

    store = SqlStateStore.from_url(db.url)
    try:
        with pytest.raises(SchemaVersionError) as caught:
            await store.ensure_schema()
    finally:
        await store.close()
    assert caught.value.found == NEWER
    assert caught.value.supported == HEAD
    _assert_names_versions(str(caught.value))

    engine = Engine(db.url, workflows=[])
    with pytest.raises(SchemaVersionError) as caught:
        await engine.open()
    await engine.close()
    _assert_names_versions(str(caught.value))
    # The message says which database: the SQLite file, or the PostgreSQL schema.
    assert (db.schema or str(db.path)) in str(caught.value)

    assert await db.snapshot() == before


async def test_the_current_version_still_opens(db: Db) -> None:
    """The refusal is only for versions above this code's: its own version is fine."""
    async with Engine(db.url, workflows=[]) as engine:
        run = await engine.get_run("kept-run")
    assert run is not None


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return durably_cli(*args, cwd=cwd)


@pytest.mark.parametrize("sql_only", [False, True], ids=["apply", "sql"])
async def test_db_upgrade_refuses_a_newer_schema(db: Db, tmp_path: Path, sql_only: bool) -> None:
    await db.stamp(NEWER)
    before = await db.snapshot()
    args = ["db", "upgrade", "--store", db.url, *(["--sql"] if sql_only else [])]
    result = _cli(*args, cwd=tmp_path)
    assert result.returncode == 1, result
    _assert_names_versions(result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stdout == ""  # no SQL printed, nothing reported as applied
    assert await db.snapshot() == before


async def test_a_read_command_refuses_a_newer_schema(db: Db, tmp_path: Path) -> None:
    await db.stamp(NEWER)
    before = await db.snapshot()
    result = _cli("runs", "list", "--store", db.url, cwd=tmp_path)
    assert result.returncode != 0, result
    _assert_names_versions(result.stderr)
    assert "kept-run" not in result.stdout
    assert await db.snapshot() == before
