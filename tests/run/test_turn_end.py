"""A turn that ends while a sibling branch of a gather is still writing its step's row.

In classic mode (`always_replay`) a wait raises out of its branch and ends the turn while the
other branches of the `asyncio.gather` still run. The turn's end must wait for a step a
branch has begun until that step's row is written; otherwise the next turn of the run reads
no row at that position and runs the step a second time. The reference store here holds one
write of the step's row until the test lets it go, so the next turn is sure to start while it
is held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import durably
from durably import Engine, InMemoryStateStore, StepCheckpoint, WorkflowCtx
from durably.transports import InMemoryTransport
from tests.engine_support import FAST_TUNING, RESULT_TIMEOUT, wait_until


class _HeldRowStore(InMemoryStateStore):
    """The reference store, whose first write of the row `name` with `status` waits until
    the test lets it go."""

    def __init__(self, name: str, status: str) -> None:
        super().__init__()
        self._name = name
        self._status = status
        self.entered = asyncio.Event()
        self.let_go = asyncio.Event()

    async def save_checkpoint(self, cp: StepCheckpoint) -> None:
        if cp.name == self._name and cp.status == self._status and not self.entered.is_set():
            self.entered.set()
            await self.let_go.wait()
        await super().save_checkpoint(cp)


async def _go_on_while_held(store: _HeldRowStore, go_on: Callable[[], Awaitable[None]]) -> None:
    """Once the row is held: let the run go on (a next turn could start now) and give such a
    turn time to reach the step. The caller then checks and lets the held write go."""
    await asyncio.wait_for(store.entered.wait(), RESULT_TIMEOUT)
    await go_on()
    await asyncio.sleep(0.3)


async def test_a_remote_step_is_dispatched_once_when_its_sibling_ends_the_turn(uid: str) -> None:
    """Branch `a` is writing its pending row when branch `b`'s wait ends the turn; `b`'s
    result then starts the next turn. Before the fix that turn found no row for `a` and
    dispatched it again."""
    store = _HeldRowStore(f"{uid}:a", "pending")
    ran = {"a": 0, "b": 0}

    @durably.step(f"{uid}:a")
    async def a() -> str:
        ran["a"] += 1
        return "a"

    @durably.step(f"{uid}:b")
    async def b() -> str:
        ran["b"] += 1
        return "b"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[str]:
        return list(await asyncio.gather(ctx.step(a), ctx.step(b)))

    async with Engine(
        store=store,
        workflows=[wf],
        transport=InMemoryTransport(),
        steps=[a, b],
        always_replay=True,
        **FAST_TUNING,
    ) as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")

        async def b_ran() -> None:
            async def done() -> bool:
                return ran["b"] == 1

            await wait_until(done)

        await _go_on_while_held(store, b_ran)
        assert ran["a"] == 0  # no next turn sent `a` while its first pending row was held
        store.let_go.set()
        assert await handle.result(timeout=RESULT_TIMEOUT) == ["a", "b"]
    assert ran == {"a": 1, "b": 1}


@pytest.mark.parametrize("kind", ["step", "local_step"])
async def test_an_in_process_step_runs_once_when_its_sibling_ends_the_turn(
    uid: str, kind: str
) -> None:
    """Branch `a` ran its step (`ctx.step` in-process, or `ctx.local_step`) and is writing
    the result when branch `b`'s signal wait ends the turn; the signal then starts the next
    turn. Before the fix that turn found no row for `a` and ran it again."""
    name = f"{uid}:a"
    store = _HeldRowStore(name, "completed")
    ran = {"a": 0}

    async def body() -> str:
        ran["a"] += 1
        await asyncio.sleep(0.05)  # still running when `b` ends the turn
        return "a"

    a = durably.step(name)(body)

    async def local(log: Any) -> str:
        return await body()

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[Any]:
        call = ctx.step(a) if kind == "step" else ctx.local_step(name, local)
        return list(await asyncio.gather(call, ctx.wait_for_signal(f"{uid}.go")))

    async with Engine(store=store, workflows=[wf], always_replay=True, **FAST_TUNING) as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")

        async def signal() -> None:
            await engine.signal(f"{uid}.go", "go")

        await _go_on_while_held(store, signal)
        assert ran["a"] == 1  # no next turn ran `a` again while its result was held
        store.let_go.set()
        assert await handle.result(timeout=RESULT_TIMEOUT) == ["a", "go"]
    assert ran == {"a": 1}


async def test_a_wait_left_parked_by_a_finished_body_holds_nothing(uid: str) -> None:
    """A resident body whose gather failed in one branch leaves the other branch parked on
    its signal wait. The turn's end wakes that wait, so the finished run is no longer
    counted as a resident run waiting for a signal. Before the fix it stayed counted, and
    its phantom idle slot let two runs execute at once under `max_concurrent_runs=1`."""
    gate = asyncio.Event()
    running = [0, 0]  # now, most at once

    @durably.step(f"{uid}:fail")
    async def fail() -> None:
        raise durably.FatalError("no")

    @durably.workflow(f"{uid}.left")
    async def left(ctx: WorkflowCtx) -> None:
        await asyncio.gather(ctx.step(fail), ctx.wait_for_signal(f"{uid}.never"))

    @durably.workflow(f"{uid}.job")
    async def job(ctx: WorkflowCtx) -> None:
        running[0] += 1
        running[1] = max(running)
        await gate.wait()
        running[0] -= 1

    async with Engine(
        store=InMemoryStateStore(), workflows=[left, job], max_concurrent_runs=1, **FAST_TUNING
    ) as engine:
        failed = await engine.start(left, run_id=f"{uid}-left")
        with pytest.raises(durably.RunFailedError):
            await failed.result(timeout=RESULT_TIMEOUT)
        handles = [await engine.start(job, run_id=f"{uid}-{i}") for i in range(2)]

        async def one_runs() -> bool:
            return running[0] >= 1

        await wait_until(one_runs)
        await asyncio.sleep(0.3)  # room for a second one, were the cap miscounted
        assert running[1] == 1
        gate.set()
        for handle in handles:
            await handle.result(timeout=RESULT_TIMEOUT)
    assert running[1] == 1
