"""Wake-ups between engines sharing a store (the `WakeBus` seam).

Engines that share one `InMemoryStateStore` object share its in-process wake bus, the
analogue of PostgreSQL's LISTEN/NOTIFY. Polling is switched off (a one-minute poll), so
everything below happens only because the wake messages arrive.
"""

from __future__ import annotations

import asyncio
import time

import durably
from durably import InMemoryStateStore, WorkflowCtx

NO_POLL = {"timer_poll_ms": 60_000}


async def test_runs_started_by_an_api_engine_reach_workers_at_once(uid: str) -> None:
    @durably.step(f"{uid}.inc")
    async def inc(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, n: int) -> int:
        for _ in range(n):
            n = await ctx.step(inc, n)
        return n

    store = InMemoryStateStore()
    async with (
        durably.Engine(store=store, workflows=[wf], instance_id="w1", **NO_POLL) as w1,
        durably.Engine(store=store, workflows=[wf], instance_id="w2", **NO_POLL) as w2,
        durably.Engine(store=store, workflows=[wf], drive=False, **NO_POLL) as api,
    ):
        await asyncio.sleep(0.05)  # the workers' boot poll passes are over
        t0 = time.perf_counter()
        handles = [await api.start(wf, 3, run_id=f"{uid}-{i}") for i in range(40)]
        results = [await h.result(timeout=5) for h in handles]
        elapsed = time.perf_counter() - t0
        done = (w1.metrics().runs["completed"], w2.metrics().runs["completed"])
    assert results == [6] * 40
    assert sum(done) == 40 and all(n > 0 for n in done), done  # both workers took work
    assert elapsed < 2.0, elapsed  # not the one-minute poll


async def test_a_signal_from_another_engine_wakes_a_resident_run(uid: str) -> None:
    entries: list[int] = []

    @durably.workflow(f"{uid}.waiter")
    async def waiter(ctx: WorkflowCtx) -> str:
        entries.append(1)
        return str(await ctx.wait_for_signal(f"{uid}.go"))

    store = InMemoryStateStore()
    async with (
        durably.Engine(store=store, workflows=[waiter], **NO_POLL) as worker,
        durably.Engine(store=store, workflows=[waiter], drive=False, **NO_POLL) as api,
    ):
        handle = await worker.start(waiter, run_id=f"{uid}-r")
        await handle.wait(timeout=5)
        t0 = time.perf_counter()
        await api.signal(f"{uid}.go", "hello")
        result = await api.get_handle(handle.run_id).result(timeout=5)
        elapsed = time.perf_counter() - t0
    assert result == "hello"
    assert entries == [1]  # woken in place on the worker, not replayed
    assert elapsed < 0.5, elapsed
