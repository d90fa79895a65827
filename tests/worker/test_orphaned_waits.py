"""A run parked in the memory of a process that died is re-driven when its lease lapses,
not at its `wakeAt` (for a signal or child wait, the reconcile fallback minutes away)."""

from __future__ import annotations

import time

import durably
from durably import WorkflowCtx
from tests.engine_support import RESULT_TIMEOUT, EngineFactory, wait_suspended, wait_until


async def test_a_suspended_run_whose_holder_died_is_redriven(
    engine_factory: EngineFactory, uid: str
) -> None:
    bodies: list[int] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        bodies.append(1)
        return str(await ctx.wait_for_signal(f"{uid}-go"))

    async with engine_factory(reconcile_ms=600_000) as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        await wait_suspended(engine, handle.run_id)
    before = len(bodies)
    # The holder died with the body parked: the row is `suspended`, still leased by it (a
    # lapsed lease), and its wakeAt is the reconcile fallback, ten minutes away.
    now = int(time.time() * 1000)
    async with engine_factory(reconcile_ms=600_000) as engine:
        await engine.store.update_run(
            handle.run_id,
            {"locked_by": "dead-instance", "locked_until": now - 1, "wake_at": now + 600_000},
        )

        async def replayed() -> bool:
            run = await engine.get_run(handle.run_id)
            return len(bodies) > before and run is not None and run.locked_by != "dead-instance"

        await wait_until(replayed, timeout=RESULT_TIMEOUT)
        await engine.signal(f"{uid}-go", "went")
        assert await engine.get_handle(handle.run_id).result(timeout=RESULT_TIMEOUT) == "went"


async def test_a_live_lease_is_not_an_orphan(engine_factory: EngineFactory, uid: str) -> None:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        return str(await ctx.wait_for_signal(f"{uid}-go"))

    async with engine_factory(reconcile_ms=600_000) as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        await wait_suspended(engine, handle.run_id)
    now = int(time.time() * 1000)
    async with engine_factory(reconcile_ms=600_000) as engine:
        await engine.store.update_run(
            handle.run_id, {"locked_by": "alive-elsewhere", "locked_until": now + 60_000}
        )
        scan = engine.store.list_orphaned_suspended
        assert await scan(now, None, 10) == []
        assert [r.id for r in await scan(now + 60_000, None, 10)] == [handle.run_id]
        await engine.recover_incomplete()
        run = await engine.get_run(handle.run_id)
        assert run is not None and run.locked_by == "alive-elsewhere"  # never taken
