"""Retention end to end on a real SQLite file and a real PostgreSQL schema: `prune` and the
`Engine(retention=[...])` sweep delete the finished runs a policy selects with every row they
own, and never touch a live run, its checkpoints, a run of another status, or a finished
parent whose child still runs. Only one engine of a store sweeps."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import RetentionPolicy, WorkflowCtx, WorkflowRun
from tests.engine_support import FAST_TUNING, RESULT_TIMEOUT, wait_until, wait_waiting_on
from tests.pg_support import connect, fresh_schema, require_pg, schema_url

# every table holding rows of a run, and the column naming it
RUN_TABLES = {
    "durable_workflow_runs": "id",
    "durable_step_checkpoints": "run_id",
    "durable_signal_waiters": "run_id",
    "durable_run_attributes": "run_id",
    "durable_run_tags": "run_id",
    "durable_run_dedup": "run_id",
}


class Where:
    def __init__(self, url: str, sqlite_path: Path | None, schema: str | None) -> None:
        self.url, self._path, self._schema = url, sqlite_path, schema

    async def rows(self, run_id: str) -> dict[str, int]:
        """How many rows of `run_id` each table holds (read past the store)."""
        found: dict[str, int] = {}
        if self._path is not None:
            with sqlite3.connect(self._path) as db:
                for table, column in RUN_TABLES.items():
                    sql = f"SELECT count(*) FROM {table} WHERE {column} = ?"
                    found[table] = db.execute(sql, (run_id,)).fetchone()[0]
            return found
        conn = await connect()
        try:
            for table, column in RUN_TABLES.items():
                sql = f'SELECT count(*) FROM "{self._schema}".{table} WHERE {column} = $1'
                found[table] = await conn.fetchval(sql, run_id)
        finally:
            await conn.close()
        return found


@pytest.fixture(params=["sqlite", "postgres"])
async def where(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Where]:
    if request.param == "sqlite":
        path = tmp_path / "durably.db"
        yield Where(f"sqlite:///{path}", path, None)
        return
    await require_pg()
    async with fresh_schema(create=False) as schema:
        yield Where(schema_url(schema), None, schema)


def old_run(run_id: str, days: int, status: str = "completed", **kw: Any) -> WorkflowRun:
    when = datetime.now(UTC) - timedelta(days=days)
    return WorkflowRun(
        id=run_id,
        workflow="report",
        workflow_version="1",
        status=status,  # type: ignore[arg-type]
        created_at=when,
        updated_at=when,
        **kw,
    )


def engine(where: Where, *workflows: Any, **options: Any) -> durably.Engine:
    return durably.Engine(store=where.url, workflows=workflows, **{**FAST_TUNING, **options})


async def test_prune_deletes_every_row_of_old_runs_and_never_a_live_one(
    where: Where, uid: str
) -> None:
    @durably.step(f"{uid}.work")
    async def work(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        y = await ctx.step(work, x)
        await ctx.wait_for_signal(f"{uid}.go:{x}")
        return y

    async with engine(where, wf) as eng:
        done = await eng.start(
            wf, 1, tags=["vip"], search_attributes={"customer": "acme"}, dedup_id=f"{uid}-d"
        )
        await wait_waiting_on(eng, done.run_id, f"{uid}.go:1")
        await eng.signal(f"{uid}.go:1", None)
        assert await done.result(timeout=RESULT_TIMEOUT) == 2
        live = await eng.start(wf, 2, tags=["vip"], search_attributes={"customer": "acme"})
        await wait_waiting_on(eng, live.run_id, f"{uid}.go:2")
        for i in range(5):
            await eng.store.create_run(old_run(f"{uid}-old{i}", 30 + i))
        await eng.store.create_run(old_run(f"{uid}-failed", 30, status="failed"))
        before = await where.rows(done.run_id)
        assert all(before[t] >= 1 for t in RUN_TABLES if t != "durable_signal_waiters")

        by_age = RetentionPolicy(["completed"], max_age="7d")
        dry = await eng.prune(by_age, dry_run=True)
        assert (dry.count, dry.dry_run) == (5, True)
        assert await eng.get_run(f"{uid}-old0") is not None  # a dry run deletes nothing

        gone = await eng.prune(by_age, batch_size=2)
        assert gone.count == 5 and gone.batches == 3
        assert set(gone.run_ids) == {f"{uid}-old{i}" for i in range(5)}
        assert await eng.get_run(done.run_id) is not None  # finished a moment ago: kept

        # max_count=0: every completed run goes, the just-finished one too, with its rows
        assert (await eng.prune(RetentionPolicy(["completed"], max_count=0))).count == 1
        assert await where.rows(done.run_id) == dict.fromkeys(RUN_TABLES, 0)
        # the live run and its checkpoints, and the failed run, are untouched
        assert await eng.get_run(f"{uid}-failed") is not None
        kept = await where.rows(live.run_id)
        assert kept["durable_workflow_runs"] == 1 and kept["durable_step_checkpoints"] >= 1
        assert kept["durable_signal_waiters"] == 1
        await eng.signal(f"{uid}.go:2", None)
        assert await live.result(timeout=RESULT_TIMEOUT) == 3


async def test_max_count_keeps_the_most_recent(where: Where, uid: str) -> None:
    async with engine(where) as eng:
        for i in range(6):
            await eng.store.create_run(old_run(f"{uid}-{i}", 10 - i))
        result = await eng.prune(RetentionPolicy(["completed"], max_count=2))
        assert result.count == 4
        left = [r.id for r in await eng.store.list_runs(durably.RunQuery(limit=100))]
        assert sorted(left) == [f"{uid}-4", f"{uid}-5"]


async def test_a_finished_parent_of_a_live_child_is_kept(where: Where, uid: str) -> None:
    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        await ctx.wait_for_signal(f"{uid}.release")
        return x

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx, x: int) -> str:
        await ctx.start_child(child, x, id=f"{uid}-kid")
        return "started"

    async with engine(where, parent, child) as eng:
        handle = await eng.start(parent, 1)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "started"
        await wait_waiting_on(eng, f"{uid}-kid", f"{uid}.release")
        everything = RetentionPolicy(["completed"], max_count=0)
        assert (await eng.prune(everything)).count == 0
        assert await eng.get_run(handle.run_id) is not None
        await eng.signal(f"{uid}.release", None)
        assert await eng.result(f"{uid}-kid", timeout=RESULT_TIMEOUT) == 1
        assert (await eng.prune(everything)).count == 2


async def test_the_sweep_runs_on_one_driving_engine_only(where: Where, uid: str) -> None:
    policy = RetentionPolicy(["completed", "cancelled"], max_age="1d")
    async with engine(where) as seeder:
        for i in range(3):
            await seeder.store.create_run(old_run(f"{uid}-{i}", 5))
    first = engine(where, retention=[policy], retention_sweep_ms=0)
    second = engine(where, retention=[policy], retention_sweep_ms=0)
    replica = engine(where, retention=[policy], retention_sweep_ms=0, drive=False)
    async with first, second, replica:
        await wait_until(lambda: _swept(first, second))
        assert first.retention.holds != second.retention.holds
        assert not replica.retention.holds and replica.retention.sweeps == 0
        sweeper = first if first.retention.holds else second
        assert sum(r.count for r in sweeper.retention.last) == 3
        assert await first.store.list_runs(durably.RunQuery(limit=10)) == []


async def _swept(*engines: durably.Engine) -> bool:
    return any(e.retention.sweeps for e in engines)


@pytest.mark.parametrize(
    ("retention", "problem"),
    [
        ([RetentionPolicy(["completed"], max_age="1d")] * 2, "one policy only"),
        (["30d"], "not a durably.RetentionPolicy"),
    ],
)
def test_bad_retention_is_refused_at_construction(retention: Any, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        durably.Engine("memory", retention=retention)
