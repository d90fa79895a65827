"""A child fan spread over two engines sharing one store: the parent's engine runs only a few
children at a time, the other engine takes the rest from the shared backlog; completions
delivered by the other engine reach the parked parent (batched, behind the join barrier)."""

from __future__ import annotations

import collections

import durably
from durably import EngineEvent, WorkflowCtx
from tests.engine_support import EngineFactory


async def test_a_fan_is_shared_by_two_engines(engine_factory: EngineFactory, uid: str) -> None:
    @durably.step(f"{uid}.leaf")
    def leaf(i: int) -> int:
        return i + 1

    @durably.workflow(f"{uid}.child")
    async def child(ctx: WorkflowCtx, i: int) -> int:
        return await ctx.step(leaf, i)

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx, n: int) -> int:
        return sum(await ctx.all(child, range(n)))

    settled_by: collections.Counter[str] = collections.Counter()

    def counter(name: str):  # type: ignore[no-untyped-def]
        def on_event(event: EngineEvent) -> None:
            if event.type == "run.completed" and event.workflow == f"{uid}.child":
                settled_by[name] += 1

        return on_event

    n = 120
    async with engine_factory(instance_id=f"{uid}-a", max_concurrent_runs=3) as a:
        async with engine_factory(instance_id=f"{uid}-b") as b:
            a.subscribe(counter("a"))
            b.subscribe(counter("b"))
            handle = await a.start(parent, n, run_id=f"{uid}-p")
            assert await a.get_handle(handle.run_id).result(timeout=60) == n * (n + 1) // 2
    assert settled_by["a"] + settled_by["b"] == n, settled_by
    assert settled_by["b"] > 0, settled_by  # the other engine took part of the fan
