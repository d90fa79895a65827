"""The Engine's list-side read methods (lists, waiting, facets, worker health) end to end."""

from __future__ import annotations

import time
from pathlib import Path

import durably
from durably import (
    ActivityBucket,
    ActivityWindow,
    Client,
    Engine,
    FatalError,
    SyncClient,
    WorkflowCtx,
)
from tests.engine_support import RESULT_TIMEOUT, EngineFactory, wait_status, wait_suspended


async def test_facets_counts_waiting_and_health(engine_factory: EngineFactory, uid: str) -> None:
    @durably.workflow(f"{uid}.ok")
    async def ok_wf(ctx: WorkflowCtx, x: int) -> int:
        return x

    @durably.workflow(f"{uid}.bad")
    async def bad_wf(ctx: WorkflowCtx, x: int) -> int:
        raise FatalError("no", code="NO")

    @durably.workflow(f"{uid}.waits")
    async def waits_wf(ctx: WorkflowCtx, x: int) -> int:
        return int(await ctx.wait_for_signal(f"{uid}-go-{x}"))

    async with engine_factory() as engine:
        for i in range(5):
            await engine.execute(ok_wf, i, run_id=f"{uid}-ok{i}", tags=["t-ok"], timeout=10)
        for i in range(2):
            handle = await engine.start(bad_wf, i, run_id=f"{uid}-bad{i}", tags=["t-bad"])
            await wait_status(engine, handle.run_id, "failed")
        handle = await engine.start(waits_wf, 7, run_id=f"{uid}-w", tags=["t-ok"])
        await wait_suspended(engine, handle.run_id)

        facets = await engine.run_facets(workflows=[f"{uid}.ok", f"{uid}.bad", f"{uid}.waits"])
        by_status = {row.status: row.count for row in facets}
        assert by_status == {"completed": 5, "failed": 2, "suspended": 1}
        # the status filter and the page are dropped: chips keep whole-set counts
        paged = await engine.run_facets(
            workflows=[f"{uid}.ok", f"{uid}.bad", f"{uid}.waits"], status="failed", limit=1
        )
        assert {row.status: row.count for row in paged} == by_status

        assert await engine.count_runs(tag="t-ok", limit=2) == 6
        listed = await engine.list_runs(tag="t-ok", limit=2)
        assert len(listed) == 2

        workflows = await engine.run_value_facets("workflow", tags=["t-ok", "t-bad"])
        assert {row.value: row.count for row in workflows} == {
            f"{uid}.ok": 5,
            f"{uid}.bad": 2,
            f"{uid}.waits": 1,
        }

        waiting = await engine.waiting_for([f"{uid}-w", f"{uid}-ok0", "nope"])
        assert list(waiting) == [f"{uid}-w"]
        assert waiting[f"{uid}-w"].on == "signal"
        assert waiting[f"{uid}-w"].name == f"{uid}-go-7"

        health = await engine.worker_health()
        assert health and all(g.depth >= 0 for g in health)

        await engine.signal(f"{uid}-go-7", 7)
        assert await engine.get_handle(f"{uid}-w").result(timeout=RESULT_TIMEOUT) == 7


async def test_run_activity_counts_per_bucket_on_engine_client_and_sync_client(
    tmp_path: Path,
) -> None:
    @durably.workflow("activity.echo")
    async def echo(ctx: WorkflowCtx, x: int) -> int:
        return x

    url = f"sqlite:///{tmp_path / 'activity.db'}"
    async with Engine(url, workflows=[echo], timer_poll_ms=20) as engine:
        for i in range(3):
            await engine.execute(echo, i, run_id=f"act-{i}")
        now = int(time.time() * 1000)
        window = ActivityWindow(since_ms=now - 3_600_000, bucket_ms=60_000, buckets=61)
        on_engine = await engine.run_activity(window)
        async with Client(url) as client:
            on_client = await client.run_activity(window, workflow="activity.echo")
            none = await client.run_activity(window, workflow="nothing")
    assert sum(b.started for b in on_engine) == 3 == sum(b.completed for b in on_engine)
    assert on_client == on_engine and none == []
    assert all(isinstance(b, ActivityBucket) for b in on_engine)
    with SyncClient(url) as sync:
        assert sync.run_activity(window) == on_engine
