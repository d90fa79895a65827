"""Flow-control queues in the engine: `ctx.step(..., queue=)` holds a slot while it runs.

Each test runs on SQLite (admission in-process) and PostgreSQL (admission in the store),
resident and classic (`engines` in conftest.py). Steps write a side-effect log with the
times they ran; the number in flight is computed from it, never from the engine's own
bookkeeping.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

import durably
from durably import Queue, WorkflowCtx
from durably.transports import InMemoryTransport
from tests.engine_support import EngineFactory

RESULT_TIMEOUT = 60


class SideEffects:
    """What the steps did and when (monotonic seconds)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float]] = []
        self.started: list[str] = []

    async def run(self, label: str, seconds: float) -> str:
        start = time.monotonic()
        self.started.append(label)
        await asyncio.sleep(seconds)
        self.spans.append((label, start, time.monotonic()))
        return label

    def peak(self, prefix: str = "") -> int:
        """The most steps (whose labels start with `prefix`) that ran at the same moment."""
        spans = [span for span in self.spans if span[0].startswith(prefix)]
        edges = sorted(
            [(start, 1) for _, start, _ in spans] + [(end, -1) for _, _, end in spans],
            key=lambda edge: (edge[0], edge[1]),  # an end before a start at the same time
        )
        running = peak = 0
        for _, step in edges:
            running += step
            peak = max(peak, running)
        return peak


async def test_a_queue_of_two_never_has_more_than_two_of_twenty_steps_in_flight(
    engines: EngineFactory, uid: str
) -> None:
    log = SideEffects()

    @durably.step(f"{uid}.call")
    async def call(i: int) -> str:
        return await log.run(f"s{i}", 0.02)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[str]:
        return list(await asyncio.gather(*(ctx.step(call, i, queue="api") for i in range(20))))

    async with engines(queues=[Queue("api", concurrency=2, retry=0.05)]) as engine:
        out = await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
    assert out == [f"s{i}" for i in range(20)]
    assert len(log.spans) == 20
    assert log.peak() == 2  # reached, never passed


async def test_the_bound_holds_across_runs(engines: EngineFactory, uid: str) -> None:
    log = SideEffects()

    @durably.step(f"{uid}.call")
    async def call(label: str) -> str:
        return await log.run(label, 0.02)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, n: int) -> int:
        done = await asyncio.gather(*(ctx.step(call, f"{n}.{i}", queue="api") for i in range(5)))
        return len(done)

    async with engines(queues=[Queue("api", concurrency=3, retry=0.05)]) as engine:
        handles = [await engine.start(wf, n, run_id=f"{uid}-{n}") for n in range(4)]
        results = [await h.result(timeout=RESULT_TIMEOUT) for h in handles]
    assert results == [5, 5, 5, 5]
    assert log.peak() == 3


async def test_steps_without_a_queue_or_of_another_queue_are_not_held_back(
    engines: EngineFactory, uid: str
) -> None:
    log = SideEffects()

    @durably.step(f"{uid}.call")
    async def call(label: str) -> str:
        return await log.run(label, 0.1)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        calls = [ctx.step(call, "a0", queue="one"), ctx.step(call, "a1", queue="one")]
        calls += [ctx.step(call, "b0", queue="two"), ctx.step(call, "free")]
        return len(await asyncio.gather(*calls))

    queues = [Queue("one", concurrency=1, retry=0.05), Queue("two", concurrency=1)]
    async with engines(queues=queues) as engine:
        assert await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 4
    assert log.peak("a") == 1
    if not engines.replay:
        # A resident body runs them together: a0 (or a1), b0 and the unqueued one. (A
        # classic turn ends when a1 must wait, and b0 may start in the next one.)
        assert log.peak() == 3


async def test_higher_priority_steps_are_admitted_first(engines: EngineFactory, uid: str) -> None:
    log = SideEffects()
    gate = asyncio.Event()

    @durably.step(f"{uid}.hold")
    async def hold() -> str:
        await gate.wait()
        return "held"

    @durably.step(f"{uid}.call")
    async def call(label: str) -> str:
        return await log.run(label, 0.0)

    @durably.workflow(f"{uid}.first")
    async def first(ctx: WorkflowCtx) -> str:
        return await ctx.step(hold, queue="one")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, priority: int) -> str:
        return await ctx.step(call, f"p{priority}", queue="one", priority=priority)

    async with engines(queues=[Queue("one", concurrency=1, retry=0.1)]) as engine:
        blocker = await engine.start(first, run_id=f"{uid}-first")
        await _until(lambda: engine.registration(f"{uid}.first") is not None)
        await asyncio.sleep(0.3)  # the blocker holds the slot
        handles = []
        for priority in (0, 5, 1):
            handles.append(await engine.start(wf, priority, run_id=f"{uid}-p{priority}"))
            await asyncio.sleep(0.3)  # each is in line before the next comes
        gate.set()
        await blocker.result(timeout=RESULT_TIMEOUT)
        for handle in handles:
            await handle.result(timeout=RESULT_TIMEOUT)
    assert log.started == ["p5", "p1", "p0"]


async def test_a_rate_limited_queue_spreads_the_steps_over_windows(
    engines: EngineFactory, uid: str
) -> None:
    stamps: list[float] = []

    @durably.step(f"{uid}.call")
    async def call(i: int) -> int:
        stamps.append(time.monotonic())
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        done = await asyncio.gather(*(ctx.step(call, i, queue="rated") for i in range(9)))
        return len(done)

    async with engines(queues=[Queue("rated", rate=(3, 0.5), retry=0.05)]) as engine:
        began = time.monotonic()
        assert await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 9
    # Three per aligned window of 500 ms: the last three cannot be admitted before the third
    # window. The first admission comes after `began`, in a window that started less than
    # 500 ms before `began`, so the third window starts more than 500 ms after `began`, and
    # every body starts after its admission. (Not measured from the first body: in classic
    # mode a step admitted in one window may run in a later turn, which asks again and is
    # told the slot is already its own, so the first body can start late.) The count per
    # window is the conformance suite's.
    assert len(stamps) == 9
    assert max(stamps) - began >= 0.499  # (admissions are stamped in whole ms)


async def test_a_cancelled_run_gives_its_slot_back(engines: EngineFactory, uid: str) -> None:
    started = asyncio.Event()

    @durably.step(f"{uid}.stuck")
    async def stuck() -> str:
        started.set()
        await asyncio.sleep(3600)
        return "never"

    @durably.step(f"{uid}.quick")
    async def quick() -> str:
        return "quick"

    @durably.workflow(f"{uid}.a")
    async def a(ctx: WorkflowCtx) -> str:
        return await ctx.step(stuck, queue="one")

    @durably.workflow(f"{uid}.b")
    async def b(ctx: WorkflowCtx) -> str:
        return await ctx.step(quick, queue="one")

    async with engines(queues=[Queue("one", concurrency=1, retry=0.1)]) as engine:
        await engine.start(a, run_id=f"{uid}-a")
        await asyncio.wait_for(started.wait(), RESULT_TIMEOUT)
        waiting = await engine.start(b, run_id=f"{uid}-b")
        await asyncio.sleep(0.5)
        assert (await engine.get_run(f"{uid}-b")).status != "completed"  # type: ignore[union-attr]
        await engine.cancel(f"{uid}-a")
        assert await waiting.result(timeout=RESULT_TIMEOUT) == "quick"


async def test_a_step_retried_after_a_failure_asks_for_a_slot_again(
    engines: EngineFactory, uid: str
) -> None:
    log = SideEffects()
    attempts: dict[int, int] = {}

    @durably.step(f"{uid}.flaky", retries=3, backoff_ms=10)
    async def flaky(i: int) -> int:
        attempts[i] = attempts.get(i, 0) + 1
        await log.run(f"{i}.{attempts[i]}", 0.02)
        if attempts[i] == 1:
            raise RuntimeError("first attempt fails")
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        return sum(await asyncio.gather(*(ctx.step(flaky, i, queue="q") for i in range(6))))

    async with engines(queues=[Queue("q", concurrency=2, retry=0.05)]) as engine:
        assert await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 15
    assert len(log.spans) == 12
    assert log.peak() == 2


async def test_register_queue_after_the_engine_is_built(engines: EngineFactory, uid: str) -> None:
    log = SideEffects()

    @durably.step(f"{uid}.call")
    async def call(i: int) -> int:
        await log.run(str(i), 0.02)
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        return sum(await asyncio.gather(*(ctx.step(call, i, queue="late") for i in range(6))))

    async with engines() as engine:
        engine.register_queue(Queue("late", concurrency=1, retry=0.05))
        assert await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 15
    assert log.peak() == 1


async def test_an_unregistered_queue_holds_nothing_back_and_says_so(
    engines: EngineFactory, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    log = SideEffects()

    @durably.step(f"{uid}.call")
    async def call(i: int) -> int:
        await log.run(str(i), 0.05)
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        return sum(await asyncio.gather(*(ctx.step(call, i, queue="nowhere") for i in range(4))))

    with caplog.at_level(logging.WARNING, logger="durably"):
        async with engines() as engine:
            assert await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 6
    assert log.peak() == 4
    assert any("'nowhere' is not registered" in r.getMessage() for r in caplog.records)


async def test_remote_steps_hold_their_slot_until_the_result_is_settled(
    engines: EngineFactory, uid: str
) -> None:
    log = SideEffects()

    @durably.step(f"{uid}:call")
    async def call(i: int) -> int:
        await log.run(str(i), 0.03)
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        return sum(await asyncio.gather(*(ctx.step(call, i, queue="api") for i in range(12))))

    async with engines(
        transport=InMemoryTransport(),
        steps=[call],
        queues=[Queue("api", concurrency=2, retry=0.05)],
    ) as engine:
        assert await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 66
    assert len(log.spans) == 12
    assert log.peak() == 2


def test_queue_settings_are_checked_when_declared() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        Queue("q", concurrency=0)
    with pytest.raises(ValueError, match="rate"):
        Queue("q", rate=(0, 1))
    with pytest.raises(ValueError, match="rate period"):
        Queue("q", rate=(5, "soon"))
    with pytest.raises(ValueError, match="fairness"):
        Queue("q", fairness="random")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="name"):
        Queue("")
    assert Queue("q", rate=(100, "1s")).rate_period_ms == 1000
    assert Queue("q", retry=0.25).retry_ms == 250


async def test_step_options_that_need_a_queue_are_refused_without_one(uid: str) -> None:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> dict[str, str]:
        refused = {}
        for label, attempt in {
            "fairness_key": lambda: ctx.step("x", 1, fairness_key="tenant"),
            "priority": lambda: ctx.step("x", 1, priority=2),
        }.items():
            try:
                attempt()
            except (ValueError, NotImplementedError) as exc:
                refused[label] = f"{type(exc).__name__}: {exc}"
        return refused

    async with durably.Engine(durably.InMemoryStateStore()) as engine:
        refused: dict[str, Any] = await engine.execute(wf, run_id=f"{uid}-r", timeout=10)
    assert refused["fairness_key"].startswith("ValueError: ctx.step(fairness_key=...) needs")
    assert refused["priority"].startswith("NotImplementedError: ctx.step: step priority")


async def _until(predicate: Any, timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - polls a plain value, not an event
            await asyncio.sleep(0.01)


async def test_a_cancelled_run_gives_up_its_place_in_line(engines: EngineFactory, uid: str) -> None:
    gate = asyncio.Event()
    ran: list[str] = []

    @durably.step(f"{uid}.hold")
    async def hold() -> str:
        await gate.wait()
        return "held"

    @durably.step(f"{uid}.call")
    async def call(label: str) -> str:
        ran.append(label)
        return label

    @durably.workflow(f"{uid}.first")
    async def first(ctx: WorkflowCtx) -> str:
        return await ctx.step(hold, queue="one")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, args: list[Any]) -> str:
        label, priority = args
        return await ctx.step(call, label, queue="one", priority=priority)

    # A long retry: after the release, the low-priority step gets in at once only if the
    # cancelled high-priority waiter left the line (else it would wait for it to lapse).
    async with engines(queues=[Queue("one", concurrency=1, retry=5.0)]) as engine:
        blocker = await engine.start(first, run_id=f"{uid}-first")
        await asyncio.sleep(0.3)
        vip = await engine.start(wf, ["vip", 9], run_id=f"{uid}-vip")
        await asyncio.sleep(0.3)
        low = await engine.start(wf, ["low", 0], run_id=f"{uid}-low")
        await asyncio.sleep(0.3)
        await engine.cancel(vip.run_id)
        await asyncio.sleep(0.3)
        gate.set()
        await blocker.result(timeout=RESULT_TIMEOUT)
        started = time.monotonic()
        assert await low.result(timeout=RESULT_TIMEOUT) == "low"
        assert time.monotonic() - started < 3.0
    assert ran == ["low"]


async def test_a_remote_step_of_a_cancelled_run_holds_its_slot_until_its_result(
    engines: EngineFactory, uid: str
) -> None:
    gate = asyncio.Event()
    started: list[str] = []

    @durably.step(f"{uid}:work")
    async def work(label: str) -> str:
        started.append(label)
        if label == "first":
            await gate.wait()
        return label

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, label: str) -> str:
        return await ctx.step(work, label, queue="one")

    async with engines(
        transport=InMemoryTransport(),
        steps=[work],
        queues=[Queue("one", concurrency=1, retry=0.1)],
    ) as engine:
        await engine.start(wf, "first", run_id=f"{uid}-a")
        await _until(lambda: started == ["first"])
        second = await engine.start(wf, "second", run_id=f"{uid}-b")
        await asyncio.sleep(0.3)
        await engine.cancel(f"{uid}-a")
        await asyncio.sleep(0.5)
        # The cancelled run's step is still running on its worker: its slot is still taken.
        assert started == ["first"]
        gate.set()  # its result comes back, is dropped (the run is cancelled), frees the slot
        assert await second.result(timeout=RESULT_TIMEOUT) == "second"
    assert started == ["first", "second"]
