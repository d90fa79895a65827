"""Capability routing without a transport: an engine runs steps in-process and declares no
capabilities, so a step that requires some can never run here — the run is parked `blocked`
with the reason, re-checked on its wake, and never runs the step."""

from __future__ import annotations

import asyncio

import durably
from durably import EngineEvent, WorkflowCtx
from tests.engine_support import EngineFactory


async def test_a_step_with_requirements_blocks_an_engine_without_transport(
    engine_factory: EngineFactory, uid: str
) -> None:
    ran: list[int] = []

    @durably.step(f"{uid}.gpu", requires=["gpu", "cuda"])
    async def on_gpu(x: int) -> int:
        ran.append(x)
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(on_gpu, x)

    events: list[EngineEvent] = []
    async with engine_factory(steps=[on_gpu]) as engine:
        engine.subscribe(events.append)
        handle = await engine.start(wf, 1, run_id=f"{uid}-r")
        run = await handle.wait(timeout=10)
        assert run.status == "blocked"
        assert run.error is not None and run.error.code == "capability.unavailable"
        assert "requires cuda, gpu" in run.error.message
        assert run.wake_at is not None  # re-checked, not abandoned
        await asyncio.sleep(0.2)
        assert engine.metrics().runs["blocked"] >= 1
    blocked = [e for e in events if e.type == "run.blocked"]
    assert blocked and blocked[0].requires == ("cuda", "gpu")
    assert ran == []  # the step never ran here
