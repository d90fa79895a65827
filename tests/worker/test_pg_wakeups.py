"""Cross-engine wake-ups on PostgreSQL (LISTEN/NOTIFY; polling is only the fallback).

Every engine here has its own store object — its own pool and its own LISTEN connection —
exactly as separate processes would. Polling is switched off (one-minute polls), so work
moves between engines only through NOTIFY, and the timings show milliseconds, not polls.
"""

from __future__ import annotations

import asyncio
import time

import durably
from durably import WorkflowCtx
from tests.pg_support import pg_schema, pg_url  # noqa: F401

NO_POLL = {"timer_poll_ms": 60_000}


async def test_start_signal_and_child_completion_cross_engines_in_milliseconds(
    pg_url: str,  # noqa: F811
    uid: str,
) -> None:
    entries: list[str] = []

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, x: int) -> int:
        return x * 2

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> int:
        entries.append(ctx.run_id)
        got = await ctx.wait_for_signal(f"{uid}.go")
        return int(await ctx.child(child, int(got), id=f"{uid}-kid"))

    flows = [parent, child]
    async with (
        durably.Engine(store=pg_url, workflows=flows, instance_id=f"{uid}-w1", **NO_POLL) as w1,
        durably.Engine(store=pg_url, workflows=flows, instance_id=f"{uid}-w2", **NO_POLL) as w2,
        durably.Engine(store=pg_url, workflows=flows, drive=False, **NO_POLL) as api,
    ):
        await asyncio.sleep(0.2)  # the boot poll passes are over: from here on, NOTIFY only
        t0 = time.perf_counter()
        handle = await api.start(parent, run_id=f"{uid}-p")
        run = await handle.wait(timeout=5)  # a worker picked it up and it waits for the signal
        picked_up = time.perf_counter() - t0
        assert run.status == "suspended"
        t1 = time.perf_counter()
        await api.signal(f"{uid}.go", 21)
        result = await handle.result(timeout=5)
        finished = time.perf_counter() - t1
        completed = w1.metrics().runs["completed"] + w2.metrics().runs["completed"]
    assert result == 42
    assert completed == 2  # the parent and its child, both on the workers
    assert entries == [f"{uid}-p"]  # the parent was woken in place, never replayed
    # one-minute polls: anything under a second can only be the wake bus
    assert picked_up < 1.0, picked_up
    assert finished < 1.0, finished
