"""Steps over a transport, against the reference in-process transport (`InMemoryTransport`).

The rules under test are the engine's, the same whichever broker carries the messages: the
`pending` row written before the task leaves, results settled by compare-and-set (a duplicate
or late result writes nothing), retries driven by failed results, `FatalError` never retried,
an unanswered attempt timing out, a dispatch no transport takes failing the attempt
retryably, and a wide fan of remote steps. Each test runs on memory and SQLite, resident and
replay (tests/engine_support.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import durably
from durably import FatalError, WorkflowCtx
from durably._core.wire import RemoteTask, StepResult
from durably.transports import InMemoryBroker, InMemoryTransport, TransportUnavailableError
from tests.engine_support import EngineFactory


async def wait_until(predicate: Callable[[], bool], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - polls a plain list, not an event
            await asyncio.sleep(0.01)


RESULT_TIMEOUT = 20


async def test_a_step_goes_over_the_transport_and_its_result_settles_the_run(
    engine_factory: EngineFactory, uid: str
) -> None:
    calls: list[int] = []

    @durably.step(f"{uid}:double")
    async def double(x: int) -> int:
        calls.append(x)
        return x * 2

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(double, x) + await ctx.step(double, x + 1)

    transport = InMemoryTransport()
    async with engine_factory(transport=transport, steps=[double]) as engine:
        assert await engine.execute(wf, 5, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 22
        rows = await engine.list_checkpoints(f"{uid}-r")
    assert calls == [5, 6]
    assert [(r.seq, r.kind, r.status, r.worker_group) for r in rows] == [
        (0, "remote", "completed", f"{uid}-double"),  # `:` is not allowed in a queue token
        (1, "remote", "completed", f"{uid}-double"),
    ]
    sent = transport.broker.dispatched
    assert [(t.step_id, t.group, t.attempt, t.input) for t in sent] == [
        (f"{uid}-r:0", f"{uid}-double", 1, 5),
        (f"{uid}-r:1", f"{uid}-double", 1, 6),
    ]


async def test_an_orchestrator_without_the_step_waits_for_a_worker_that_has_it(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.step(f"{uid}.inc")
    async def inc(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(inc, x)

    broker = InMemoryBroker()
    # The orchestrator serves no steps; the worker is another engine on its own store that
    # only serves `inc` over the same broker.
    async with engine_factory(transport=InMemoryTransport(broker), steps=[]) as engine:
        handle = await engine.start(wf, 1, run_id=f"{uid}-r")
        await asyncio.sleep(0.2)
        run = await engine.get_run(handle.run_id)
        assert run is not None and run.status == "suspended"  # waiting for its step
        worker = durably.Engine(
            "memory", transport=InMemoryTransport(broker), steps=[inc], role="worker"
        )
        async with worker:
            assert await handle.result(timeout=RESULT_TIMEOUT) == 2


async def test_failed_results_are_retried_and_a_fatal_error_is_not(
    engine_factory: EngineFactory, uid: str
) -> None:
    attempts: dict[str, int] = {"flaky": 0, "fatal": 0}

    @durably.step(f"{uid}.flaky", retries=3)
    async def flaky(x: int) -> int:
        attempts["flaky"] += 1
        if attempts["flaky"] < 3:
            raise RuntimeError(f"try {attempts['flaky']}")
        return x

    @durably.step(f"{uid}.fatal", retries=5)
    async def fatal(x: int) -> int:
        attempts["fatal"] += 1
        raise FatalError("nope", code="E1", details={"k": x})

    @durably.workflow(f"{uid}.ok")
    async def ok(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(flaky, x)

    @durably.workflow(f"{uid}.bad")
    async def bad(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(fatal, x)

    async with engine_factory(transport=InMemoryTransport(), steps=[flaky, fatal]) as engine:
        assert await engine.execute(ok, 7, run_id=f"{uid}-ok", timeout=RESULT_TIMEOUT) == 7
        with pytest.raises(durably.RunFailedError) as info:
            await engine.execute(bad, 3, run_id=f"{uid}-bad", timeout=RESULT_TIMEOUT)
        rows = await engine.list_checkpoints(f"{uid}-ok")
    assert attempts == {"flaky": 3, "fatal": 1}
    assert rows[0].status == "completed" and rows[0].attempts == 3
    error = info.value.error
    assert error is not None and (error.code, error.details) == ("E1", {"k": 3})


async def test_a_duplicate_result_writes_nothing(engine_factory: EngineFactory, uid: str) -> None:
    release = asyncio.Event()

    @durably.step(f"{uid}.slow")
    async def slow(x: int) -> int:
        await release.wait()
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        first = await ctx.step(slow, x)
        return first

    transport = InMemoryTransport()
    async with engine_factory(transport=transport, steps=[slow]) as engine:
        handle = await engine.start(wf, 1, run_id=f"{uid}-r")
        await wait_until(lambda: bool(transport.broker.dispatched))
        # A result for the step arrives before the worker's own (a redelivered task run
        # twice): it wins; the worker's later result loses the compare-and-set.
        early = StepResult(
            run_id=f"{uid}-r", seq=0, step_id=f"{uid}-r:0", status="completed", output=41
        )
        transport.broker.publish_result(early)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 41
        release.set()
        await asyncio.sleep(0.2)
        rows = await engine.list_checkpoints(f"{uid}-r")
        run = await engine.get_run(handle.run_id)
    assert [(r.status, r.output) for r in rows] == [("completed", 41)]
    assert run is not None and run.output == 41


async def test_an_unanswered_attempt_times_out_and_is_retried(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{uid}.nobody", x, timeout=0.2, retries=2)

    transport = InMemoryTransport()
    async with engine_factory(transport=transport, steps=[]) as engine:
        with pytest.raises(durably.RunFailedError) as info:
            await engine.execute(wf, 1, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
    error = info.value.error
    assert error is not None and error.code == "timeout"
    assert [t.attempt for t in transport.broker.dispatched] == [1, 2]


class _Refusing(InMemoryTransport):
    """A broker that is down: every dispatch is refused."""

    async def dispatch(self, task: RemoteTask) -> None:
        raise TransportUnavailableError("broker at 127.0.0.1:1 refused the connection")


async def test_a_dispatch_no_transport_takes_fails_the_attempt_retryably(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{uid}.x", x, retries=2)

    async with engine_factory(transport=_Refusing(), steps=[]) as engine:
        with pytest.raises(durably.RunFailedError) as info:
            await engine.execute(wf, 1, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
        rows = await engine.list_checkpoints(f"{uid}-r")
    error = info.value.error
    assert error is not None and error.code == "dispatch_failed"
    assert "refused the connection" in error.message
    assert rows[0].status == "failed" and rows[0].attempts == 2


async def test_a_fan_of_remote_steps(engine_factory: EngineFactory, uid: str) -> None:
    @durably.step(f"{uid}.sq")
    async def sq(x: int) -> int:
        return x * x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, n: int) -> int:
        return sum(await ctx.all(sq, list(range(n))))

    n = 300
    async with engine_factory(transport=InMemoryTransport(), steps=[sq]) as engine:
        total = await engine.execute(wf, n, run_id=f"{uid}-r", timeout=60)
        rows = await engine.list_checkpoints(f"{uid}-r")
    assert total == sum(i * i for i in range(n))
    assert len(rows) == n and all(r.status == "completed" and r.kind == "remote" for r in rows)


async def test_a_short_remote_wait_writes_no_status_and_a_long_one_is_suspended(
    engine_factory: EngineFactory, uid: str
) -> None:
    """A wait for a step in flight leaves the run `running` (no status write for a round trip
    of a few ms); one that outlives the grace is written `suspended`, and `running` again
    once the result lands; either way the run completes with the results."""
    gate = asyncio.Event()

    @durably.step(f"{uid}:quick")
    async def quick(x: int) -> int:
        return x + 1

    @durably.step(f"{uid}:slow")
    async def slow(x: int) -> int:
        await gate.wait()
        return x * 10

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(slow, await ctx.step(quick, x))

    seen: list[str] = []

    def on_event(event: durably.EngineEvent) -> None:
        if event.type == "run.suspended":
            seen.append(event.type)

    async with engine_factory(transport=InMemoryTransport(), steps=[quick, slow]) as engine:
        engine.subscribe(on_event)
        handle = await engine.start(wf, 1, run_id=f"{uid}-r")

        async def status() -> str:
            run = await engine.get_run(handle.run_id)
            return run.status if run is not None else "missing"

        async with asyncio.timeout(RESULT_TIMEOUT):
            while await status() != "suspended":  # noqa: ASYNC110 - polls the store
                await asyncio.sleep(0.02)
        gate.set()
        assert await handle.result(timeout=RESULT_TIMEOUT) == 20
    if not engine_factory.replay:
        # Resident: the quick step's wait wrote nothing; the slow one's wait, once.
        assert seen == ["run.suspended"]
