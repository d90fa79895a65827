"""Fresh schema vs versioned migrations, `upgrade` semantics, concurrent `ensure_schema`."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from durably._store.sql import (
    HEAD,
    SqlStateStore,
    current_version,
    durable_managed_tables,
    metadata,
    upgrade,
    upgrade_sync,
)
from durably._store.sql.dialect import create_engine
from durably._store.sql.migrations import MIGRATIONS, render
from tests.pg_support import connect, fresh_schema, schema_url

from .conftest import make_run, sqlite_url

SRC = str(Path(__file__).resolve().parents[2] / "src")

# ------------------------------------------------------------------ schema description


def _normalize_default(value: Any) -> str | None:
    """`'default'`, `('default')` and PostgreSQL's `'default'::text` are the same default."""
    if value is None:
        return None
    text = str(value).strip()
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    return re.sub(r"::[a-z ]+$", "", text)


def _key_text(definition: str) -> str:
    """The key of an index definition (the text inside its last parentheses), lowercased with
    whitespace and identifier quotes dropped: `status, coalesce(priority, 0) desc, created_at,
    id` (SQLAlchemy quotes a column named `key`, the migrations' DDL does not)."""
    pattern = r"\bON\s+[\w.\"]+\s+(?:USING\s+\w+\s+)?\((.*)\)\s*$"
    found = re.search(pattern, definition, re.I | re.S)
    assert found is not None, definition
    return re.sub(r"\s+", " ", found.group(1).replace('"', "")).strip().lower()


def index_keys(conn: Connection, table: str) -> dict[str, str]:
    """Every index of `table` with its key as the database itself states it. SQLAlchemy's
    reflection skips expression indexes on SQLite (the pick-up index is one), so the
    definitions come from the catalog: `sqlite_master` / `pg_indexes`."""
    if conn.dialect.name == "sqlite":
        query = (
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = :t"
            " AND sql IS NOT NULL"
        )
    else:
        query = (
            "SELECT indexname, indexdef FROM pg_indexes"
            " WHERE schemaname = current_schema() AND tablename = :t"
        )
    rows = conn.execute(sa.text(query), {"t": table}).all()
    return {name: _key_text(sql) for name, sql in rows}


def describe_schema(conn: Connection) -> dict[str, Any]:
    """Dialect-neutral description of the store's tables (works on SQLite and PostgreSQL):
    columns in order with compiled type, nullability and default; primary key; indexes (as
    reflected, and with their keys as the catalog states them)."""
    insp = sa.inspect(conn)
    managed = set(durable_managed_tables())
    out: dict[str, Any] = {}
    for table in sorted(set(insp.get_table_names()) & managed):
        columns = [
            (
                c["name"],
                c["type"].compile(dialect=conn.dialect),
                bool(c["nullable"]),
                _normalize_default(c.get("default")),
            )
            for c in insp.get_columns(table)
        ]
        pk = tuple(insp.get_pk_constraint(table)["constrained_columns"])
        with warnings.catch_warnings():
            # "Skipped unsupported reflection of expression-based index": index_keys has it.
            warnings.simplefilter("ignore", sa.exc.SAWarning)
            reflected = insp.get_indexes(table)
        indexes = sorted(
            (i["name"], tuple(i["column_names"]), bool(i["unique"])) for i in reflected
        )
        keys = index_keys(conn, table)
        out[table] = {"columns": columns, "pk": pk, "indexes": indexes, "index_keys": keys}
    return out


async def _describe(engine: AsyncEngine) -> dict[str, Any]:
    async with engine.connect() as conn:
        return await conn.run_sync(describe_schema)


def _table_names(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {r[0] for r in rows if not r[0].startswith("sqlite_")}


# ------------------------------------------------------------------ fresh == migrated


async def _fresh_equals_migrated(fresh: AsyncEngine, migrated: AsyncEngine) -> dict[str, Any]:
    try:
        async with fresh.begin() as conn:
            await conn.run_sync(metadata.create_all)
        await upgrade(migrated)
        fresh_schema = await _describe(fresh)
        migrated_schema = await _describe(migrated)
    finally:
        await fresh.dispose()
        await migrated.dispose()
    assert set(fresh_schema) == set(durable_managed_tables())
    assert fresh_schema == migrated_schema
    return fresh_schema


async def test_fresh_schema_equals_all_migrations(tmp_path: Path) -> None:
    await _fresh_equals_migrated(
        create_engine(sqlite_url(tmp_path / "fresh.db")),
        create_engine(sqlite_url(tmp_path / "migrated.db")),
    )


async def test_fresh_schema_equals_all_migrations_on_postgresql() -> None:
    async with fresh_schema() as fresh, fresh_schema(create=False) as migrated:
        described = await _fresh_equals_migrated(
            create_engine(schema_url(fresh)), create_engine(schema_url(migrated))
        )
        assert await current_version(schema_url(migrated)) == HEAD
        assert await current_version(schema_url(fresh)) == 0  # create_all stamps nothing
    attrs = described["durable_run_attributes"]
    assert ("num_value", "DOUBLE PRECISION", True, None) in attrs["columns"]
    signals = described["durable_buffered_signals"]
    assert signals["columns"][0][:3] == ("id", "BIGINT", False)


async def test_schema_matches_spec_column_names(tmp_path: Path) -> None:
    """Spot checks of the cross-store contract: the column names every store shares."""
    engine = create_engine(sqlite_url(tmp_path / "s.db"))
    try:
        await upgrade(engine)
        schema = await _describe(engine)
    finally:
        await engine.dispose()
    runs = schema["durable_workflow_runs"]
    assert [c[0] for c in runs["columns"]] == [
        "id",
        "workflow",
        "workflow_version",
        "status",
        "input",
        "output",
        "error",
        "wake_at",
        "locked_by",
        "locked_until",
        "awaiting_decision_task_id",
        "recovery_attempts",
        "tags",
        "search_attributes",
        "priority",
        "namespace",
        "origin",
        "created_at",
        "updated_at",
    ]
    assert ("namespace", "TEXT", False, "'default'") in runs["columns"]
    assert ("durable_workflow_runs_locked_by_idx", ("locked_by",), False) in runs["indexes"]
    attrs = schema["durable_run_attributes"]
    assert ("num_value", "REAL", True, None) in attrs["columns"]
    assert schema["durable_step_checkpoints"]["pk"] == ("run_id", "seq")
    assert schema["durable_buffered_signals"]["pk"] == ("id",)


def test_render_postgresql_without_connecting() -> None:
    statements = render("postgresql")
    script = ";\n".join(statements)
    assert "num_value  DOUBLE PRECISION" in script
    assert "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY" in script
    assert "AUTOINCREMENT" not in script
    assert statements[0].startswith("CREATE TABLE IF NOT EXISTS durable_schema_version")
    assert statements[-1].startswith("INSERT INTO durable_schema_version")
    sqlite_script = ";\n".join(render("sqlite"))
    assert "INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT" in sqlite_script
    assert "num_value  REAL" in sqlite_script
    assert HEAD == MIGRATIONS[-1].version
    assert [m.version for m in MIGRATIONS] == list(range(1, HEAD + 1))


# ------------------------------------------------------------------ upgrade semantics


async def test_upgrade_sql_only_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "absent.db"
    statements = await upgrade(sqlite_url(path), sql_only=True)
    assert statements and all(isinstance(s, str) for s in statements)
    assert any("CREATE TABLE IF NOT EXISTS durable_workflow_runs" in s for s in statements)
    assert not path.exists()  # not even created

    # an existing (empty) database is inspected read-only and left untouched
    sqlite3.connect(path).close()
    before = path.read_bytes()
    assert await upgrade(sqlite_url(path), sql_only=True) == statements
    assert _table_names(path) == set()
    assert path.read_bytes() == before
    assert await current_version(sqlite_url(path)) == 0


async def test_upgrade_applies_once_and_is_idempotent(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "u.db")
    assert await current_version(url) == 0
    applied = await upgrade(url)
    assert applied and applied[-1].startswith("INSERT INTO durable_schema_version")
    assert await current_version(url) == HEAD
    assert _table_names(tmp_path / "u.db") == set(durable_managed_tables())
    assert await upgrade(url) == []  # nothing pending
    assert await upgrade(url, sql_only=True) == []
    with sqlite3.connect(tmp_path / "u.db") as conn:
        versions = conn.execute("SELECT version, applied_at FROM durable_schema_version").fetchall()
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    assert [v for v, _ in versions] == list(range(1, HEAD + 1))
    now_ms = time.time() * 1000
    assert all(abs(applied_at - now_ms) < 60_000 for _, applied_at in versions)
    assert mode == "wal"


async def test_sql_only_output_executes_to_the_same_schema(tmp_path: Path) -> None:
    script = await upgrade(sqlite_url(tmp_path / "x.db"), sql_only=True)
    with sqlite3.connect(tmp_path / "manual.db") as conn:
        for statement in script:
            conn.execute(statement)
    assert await current_version(sqlite_url(tmp_path / "manual.db")) == HEAD
    manual = create_engine(sqlite_url(tmp_path / "manual.db"))
    applied = create_engine(sqlite_url(tmp_path / "applied.db"))
    try:
        await upgrade(applied)
        assert await _describe(manual) == await _describe(applied)
    finally:
        await manual.dispose()
        await applied.dispose()


async def test_upgrade_over_a_create_all_database(tmp_path: Path) -> None:
    engine = create_engine(sqlite_url(tmp_path / "c.db"))
    try:
        async with engine.begin() as conn:
            await conn.run_sync(metadata.create_all)
        assert await current_version(engine) == 0  # version table exists but is empty
        assert await upgrade(engine)  # IF NOT EXISTS everywhere: stamps the version
        assert await current_version(engine) == HEAD
    finally:
        await engine.dispose()


def test_upgrade_sync(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "sync.db")
    assert upgrade_sync(url, sql_only=True)
    assert not (tmp_path / "sync.db").exists()
    assert upgrade_sync(url)
    assert upgrade_sync(url) == []


async def test_ensure_schema_is_idempotent_and_keeps_data(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "e.db")
    first = SqlStateStore.from_url(url)
    await first.ensure_schema()
    await first.create_run(make_run())
    await first.ensure_schema()
    await first.close()
    second = SqlStateStore.from_url(url)
    await second.ensure_schema()
    assert await second.get_run("r1") is not None
    await second.close()
    assert await current_version(url) == HEAD


async def test_in_memory_store_ensure_schema() -> None:
    store = SqlStateStore.from_url("sqlite://")
    await store.ensure_schema()
    await store.create_run(make_run())
    assert await store.get_run("r1") is not None
    await store.close()


# ------------------------------------------------------------------ two processes


_CHILD = textwrap.dedent(
    """
    import asyncio, os, sys, time
    sys.path.insert(0, {src!r})
    from durably._store.sql import SqlStateStore
    from datetime import datetime, timezone
    from durably._core.models import WorkflowRun

    async def main(name: str) -> None:
        go = {go!r}
        while not os.path.exists(go):
            time.sleep(0.001)
        store = SqlStateStore.from_url({url!r})
        try:
            await store.ensure_schema()
            now = datetime.now(timezone.utc)
            await store.create_run(WorkflowRun(
                id=name, workflow="w", workflow_version="1", status="pending",
                created_at=now, updated_at=now, tags=("t",), search_attributes={{"k": 1}}))
        finally:
            await store.close()

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_concurrent_ensure_schema_in_several_processes(tmp_path: Path) -> None:
    path = tmp_path / "race.db"
    go = tmp_path / "go"
    script = _CHILD.format(src=SRC, go=str(go), url=sqlite_url(path))
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            script,
            f"p{i}",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for i in range(4)
    ]
    await asyncio.sleep(0.5)  # let every child import and reach the barrier
    go.touch()
    outputs = [await p.communicate() for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()
    assert await current_version(sqlite_url(path)) == HEAD
    with sqlite3.connect(path) as conn:
        runs = conn.execute("SELECT id FROM durable_workflow_runs ORDER BY id").fetchall()
        versions = conn.execute("SELECT count(*) FROM durable_schema_version").fetchone()
    assert runs == [(f"p{i}",) for i in range(4)]
    assert versions == (HEAD,)


async def test_concurrent_ensure_schema_in_several_processes_on_postgresql(
    tmp_path: Path,
) -> None:
    """Four processes race `ensure_schema` on a schema that does not exist yet: the advisory
    lock serialises them, exactly one creates and migrates it, all then write."""
    async with fresh_schema(create=False) as schema:
        go = tmp_path / "go"
        url = schema_url(schema)
        script = _CHILD.format(src=SRC, go=str(go), url=url)
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                script,
                f"p{i}",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for i in range(4)
        ]
        await asyncio.sleep(0.5)
        go.touch()
        outputs = [await p.communicate() for p in procs]
        for proc, (_, err) in zip(procs, outputs, strict=True):
            assert proc.returncode == 0, err.decode()
        assert await current_version(url) == HEAD
        conn = await connect()
        try:
            runs = await conn.fetch(f'SELECT id FROM "{schema}".durable_workflow_runs ORDER BY id')
            versions = await conn.fetchval(
                f'SELECT count(*) FROM "{schema}".durable_schema_version'
            )
        finally:
            await conn.close()
        assert [r["id"] for r in runs] == [f"p{i}" for i in range(4)]
        assert versions == HEAD


async def test_upgrade_by_url_on_postgresql() -> None:
    async with fresh_schema(create=False) as schema:
        url = schema_url(schema)
        assert await current_version(url) == 0  # the schema does not even exist
        rendered = await upgrade(url, sql_only=True)
        assert rendered and rendered == await upgrade(url)
        assert await current_version(url) == HEAD
        assert await upgrade(url) == []
        store = SqlStateStore.from_url(url)
        try:
            await store.ensure_schema()  # up to date: applies nothing
            await store.create_run(make_run())
            assert await store.get_run("r1") is not None
        finally:
            await store.close()
