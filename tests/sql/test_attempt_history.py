"""A step's attempt history (`attempt_errors`) on a real SQLite file and on PostgreSQL: stored
with the attempt's own write, read back after an engine restart (the run resumed by a new
engine replays from the store), and migration 7 adding the column to a version-6 database
without touching the rows already there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import RetryPolicy, WorkflowCtx
from durably._store.sql import HEAD, SqlStateStore, current_version
from durably._store.sql.dialect import create_engine
from durably._store.sql.migrations import render
from tests.engine_support import FAST_TUNING, RESULT_TIMEOUT, wait_suspended
from tests.pg_support import fresh_schema, schema_url

from .conftest import raw, sqlite_url


class Transient(Exception):
    pass


async def _restart_keeps_history(url: str, uid: str) -> tuple[Any, list[tuple[Any, ...]]]:
    calls: list[int] = []

    # A backoff long enough that the run is still waiting for its third attempt when the
    # first engine closes; the second engine runs it.
    @durably.step(f"{uid}.s", retry=RetryPolicy(max_attempts=3, backoff_ms="2s"))
    def s(x: int) -> int:
        calls.append(x)
        if len(calls) == 1:
            raise Transient("first down")
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(s, x)

    async with durably.Engine(store=url, **FAST_TUNING) as engine:
        handle = await engine.start(wf, 1, run_id=f"{uid}-r")
        await wait_suspended(engine, handle.run_id)
        [waiting] = await engine.list_checkpoints(handle.run_id)
    assert waiting.status == "failed"
    assert [(e.attempt, e.message) for e in waiting.attempt_errors or ()] == [(1, "first down")]
    async with durably.Engine(store=url, **FAST_TUNING) as engine:
        assert await engine.get_handle(handle.run_id).result(timeout=RESULT_TIMEOUT) == 2
        [done] = await engine.list_checkpoints(handle.run_id)
        detail = await engine.get_run_detail(handle.run_id)
    store = SqlStateStore.from_url(url)
    try:
        stored = await raw(store, "SELECT attempts, attempt_errors FROM durable_step_checkpoints")
    finally:
        await store.close()
    assert calls == [1, 1]
    assert done.status == "completed" and done.attempts == 2
    assert [(e.attempt, e.message) for e in done.attempt_errors or ()] == [(1, "first down")]
    assert detail is not None
    assert detail.to_json()["timeline"][0]["attemptErrors"][0]["message"] == "first down"
    return done, stored


async def test_the_history_survives_a_restart_on_a_sqlite_file(tmp_path: Path, uid: str) -> None:
    _, stored = await _restart_keeps_history(sqlite_url(tmp_path / "h.db"), uid)
    [(attempts, text)] = stored
    assert attempts == 2
    data = json.loads(text)
    assert data["omitted"] == 0
    assert [(e["attempt"], e["message"]) for e in data["errors"]] == [(1, "first down")]


async def test_the_history_survives_a_restart_on_postgresql(uid: str) -> None:
    async with fresh_schema(create=False) as schema:
        _, stored = await _restart_keeps_history(schema_url(schema), uid)
    [(attempts, text)] = stored
    assert attempts == 2
    assert [e["message"] for e in json.loads(text)["errors"]] == ["first down"]


_V6_ROW = (
    "INSERT INTO durable_step_checkpoints (run_id, seq, name, kind, step_id, status, error,"
    " attempts, started_at, finished_at) VALUES ('old', 0, 's', 'remote', 'old:0', 'failed',"
    ' \'{"message": "kept"}\', 2, 1000, 2000)'
)


async def _upgrade_v6(url: str, dialect: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            for statement in [*render(dialect, 0, 6), _V6_ROW]:
                await conn.exec_driver_sql(statement)
    finally:
        await engine.dispose()
    assert await current_version(url) == 6
    store = SqlStateStore.from_url(url)
    try:
        await store.ensure_schema()
        assert await current_version(url) == HEAD
        cp = await store.get_checkpoint("old", 0)
        assert cp is not None and cp.error is not None
        assert (cp.status, cp.attempts, cp.error.message) == ("failed", 2, "kept")
        assert cp.attempt_errors is None and cp.attempt_errors_omitted == 0
        # The upgraded table takes the history like a fresh one.
        await store.save_checkpoint(cp.with_attempt_error(2, 2000, cp.error))
        again = await store.get_checkpoint("old", 0)
        assert again is not None
        assert [e.message for e in again.attempt_errors or ()] == ["kept"]
        return await raw(store, "SELECT run_id, seq, name FROM durable_step_checkpoints")
    finally:
        await store.close()


async def test_migration_7_keeps_the_rows_of_a_version_6_sqlite_file(tmp_path: Path) -> None:
    assert await _upgrade_v6(sqlite_url(tmp_path / "v6.db"), "sqlite") == [("old", 0, "s")]


async def test_migration_7_keeps_the_rows_of_a_version_6_postgresql_schema() -> None:
    async with fresh_schema() as schema:
        rows = await _upgrade_v6(schema_url(schema), "postgresql")
    assert rows == [("old", 0, "s")]


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_migration_7_adds_one_nullable_column(dialect: str) -> None:
    statements = render(dialect, 6, 7)
    text = "\n".join(statements)
    assert "attempt_errors TEXT" in text
    assert "NOT NULL" not in text.split("attempt_errors")[1].split(",")[0]
