"""A step fan through a flow-control queue: `ctx.all(step, inputs, queue=...)` holds each
member to the queue's bound, as `ctx.step(queue=...)` does, on SQLite and PostgreSQL,
resident and classic (`engines` in conftest.py). In-flight counts come from the steps' own
side-effect log."""

from __future__ import annotations

import asyncio

import pytest

import durably
from durably import Queue, Rejected, WorkflowCtx
from tests.engine_support import EngineFactory
from tests.flow.test_engine_queues import RESULT_TIMEOUT, SideEffects


async def test_a_fan_of_thirty_through_a_queue_of_three(engines: EngineFactory, uid: str) -> None:
    log = SideEffects()

    @durably.step(f"{uid}.call")
    async def call(i: int) -> str:
        return await log.run(f"s{i}", 0.02)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[str]:
        return await ctx.all(call, list(range(30)), queue="api")

    async with engines(queues=[Queue("api", concurrency=3, retry=0.05)]) as engine:
        out = await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
    assert out == [f"s{i}" for i in range(30)]
    assert len(log.spans) == 30
    assert log.peak() == 3  # reached, never passed


async def test_a_fans_priority_puts_its_members_ahead(engines: EngineFactory, uid: str) -> None:
    """Two fans share a queue of one: every member of the high-priority fan that is waiting
    when a slot frees is admitted before the low-priority fan's waiting members."""
    log = SideEffects()

    @durably.step(f"{uid}.call")
    async def call(label: str) -> str:
        return await log.run(label, 0.02)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[list[str]]:
        # The low fan starts first and takes the only slot; both then wait in line.
        low = ctx.all(call, [f"low{i}" for i in range(4)], queue="one", priority=1)
        high = ctx.all(call, [f"high{i}" for i in range(4)], queue="one", priority=9)
        return list(await asyncio.gather(low, high))

    async with engines(queues=[Queue("one", concurrency=1, retry=0.05)]) as engine:
        out = await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
    assert out == [[f"low{i}" for i in range(4)], [f"high{i}" for i in range(4)]]
    order = [label for label, _, _ in sorted(log.spans, key=lambda span: span[1])]
    assert log.peak() == 1
    if engines.replay:
        # Replay mode: every waiting member is a suspended turn that asks again at its retry
        # time, and one that comes back later than the queue's pruning window (three retry
        # intervals: a loaded machine does that) has lost its place in line. The order is
        # pinned where waiters stay parked and keep asking (resident mode).
        return
    # Whatever ran first, once a high member was admitted no low one ran until all high ran.
    first_high = next(i for i, label in enumerate(order) if label.startswith("high"))
    assert all(label.startswith("high") for label in order[first_high : first_high + 4]), order


async def test_all_settled_through_a_queue_reports_each_member(
    engines: EngineFactory, uid: str
) -> None:
    @durably.step(f"{uid}.call", retries=0)
    async def call(i: int) -> int:
        if i == 2:
            raise durably.FatalError("no", code="bad")
        return i * 10

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[str]:
        items = await ctx.all_settled(call, [0, 1, 2, 3], queue="api", fairness_key="k")
        return [
            f"rejected:{item.code}" if isinstance(item, Rejected) else f"ok:{item.value}"
            for item in items
        ]

    async with engines(queues=[Queue("api", concurrency=2, retry=0.05)]) as engine:
        out = await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
    assert out == ["ok:0", "ok:10", "rejected:bad", "ok:30"]


@pytest.mark.parametrize("primitive", ["all", "all_settled"])
async def test_fan_queue_options_are_checked_at_the_call(
    engines: EngineFactory, uid: str, primitive: str
) -> None:
    @durably.step(f"{uid}.call")
    async def call(i: int) -> int:
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[str]:
        fan = getattr(ctx, primitive)
        errors = []
        for kwargs in (
            {"fairness_key": "k"},  # needs a queue
            {"queue": ""},  # not a queue name
            {"queue": "api", "priority": True},  # not a whole number
        ):
            try:
                fan(call, [1], **kwargs)
            except (TypeError, ValueError) as exc:
                errors.append(type(exc).__name__)
        await fan(call, [1], queue="api")
        return errors

    async with engines(queues=[Queue("api", concurrency=2)]) as engine:
        out = await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
    assert out == ["ValueError", "TypeError", "TypeError"]
