"""`RetryPolicy` for steps served over a transport (the reference `InMemoryTransport`).

The exception is raised in the process serving the step, so that process checks the step's
declared `retry_on` / `dont_retry_on` and reports a ruled-out failure `retryable: false`; the
engine never retries it. A call-site class rule cannot reach the worker and is refused. Every
failed attempt (a worker's failed result, a timeout, a refused dispatch) joins the step's
attempt history on the write that settles it.
"""

from __future__ import annotations

from typing import Any

import pytest

import durably
from durably import RetryPolicy, WorkflowCtx
from durably._core.wire import RemoteTask
from durably.transports import InMemoryBroker, InMemoryTransport, TransportUnavailableError
from tests.engine_support import EngineFactory

RESULT_TIMEOUT = 20


class Transient(Exception):
    pass


async def test_the_serving_process_applies_the_declared_classes(
    engine_factory: EngineFactory, uid: str
) -> None:
    raised: list[type[Exception]] = [Transient, Transient, KeyError]

    @durably.step(f"{uid}.s", retry=RetryPolicy(max_attempts=5, retry_on=Transient))
    async def s(x: int) -> int:
        raise raised.pop(0)(f"left {len(raised)}")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(s, x)

    transport = InMemoryTransport()
    async with engine_factory(transport=transport, steps=[s]) as engine:
        with pytest.raises(durably.RunFailedError) as info:
            await engine.execute(wf, 1, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
        [row] = await engine.list_checkpoints(f"{uid}-r")
    assert raised == []
    assert [t.attempt for t in transport.broker.dispatched] == [1, 2, 3]
    assert info.value.error.message == "'left 0'"
    assert row.status == "failed" and row.attempts == 3
    assert row.error is not None and row.error.retryable is False
    assert [(e.attempt, e.message, e.retryable) for e in row.attempt_errors or ()] == [
        (1, "left 2", None),
        (2, "left 1", None),
        (3, "'left 0'", False),
    ]


async def test_a_remote_step_that_recovers_keeps_its_failed_attempts(
    engine_factory: EngineFactory, uid: str
) -> None:
    calls: list[int] = []

    @durably.step(f"{uid}.s", retries=3)
    async def s(x: int) -> int:
        calls.append(x)
        if len(calls) < 3:
            raise Transient(f"down {len(calls)}")
        return x * 2

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(s, x)

    async with engine_factory(transport=InMemoryTransport(), steps=[s]) as engine:
        assert await engine.execute(wf, 4, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 8
        [row] = await engine.list_checkpoints(f"{uid}-r")
    assert row.status == "completed" and row.attempts == 3
    assert [(e.attempt, e.message) for e in row.attempt_errors or ()] == [
        (1, "down 1"),
        (2, "down 2"),
    ]


async def test_call_site_classes_are_refused_with_a_transport(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.step(f"{uid}.s")
    async def s(x: int) -> int:
        return x

    seen: list[str] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        try:
            await ctx.step(s, x, retry=RetryPolicy(retry_on=Transient))
        except ValueError as exc:
            seen.append(str(exc))
        # A policy without classes is fine at the call.
        return await ctx.step(s, x, retry=RetryPolicy(max_attempts=2))

    async with engine_factory(transport=InMemoryTransport(), steps=[s]) as engine:
        assert await engine.execute(wf, 3, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 3
    assert len(set(seen)) == 1  # (a replaying body sees it on every turn)
    assert "cannot apply to a step run by a worker over a transport" in seen[0]
    assert "@durably.step(retry=RetryPolicy(...))" in seen[0]


async def test_a_worker_engine_applies_its_own_declaration(
    engine_factory: EngineFactory, uid: str
) -> None:
    calls: list[int] = []

    @durably.step(f"{uid}.s", retry=RetryPolicy(max_attempts=4, dont_retry_on=Transient))
    async def s(x: int) -> int:
        calls.append(x)
        raise Transient("for good")

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(f"{uid}.s", x, retries=4)

    broker = InMemoryBroker()
    worker = durably.Engine("memory", transport=InMemoryTransport(broker), steps=[s], role="worker")
    async with engine_factory(transport=InMemoryTransport(broker), steps=[]) as engine, worker:
        with pytest.raises(durably.RunFailedError):
            await engine.execute(wf, 1, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
        [row] = await engine.list_checkpoints(f"{uid}-r")
    assert calls == [1]
    assert row.attempts == 1


async def test_timeouts_join_the_history_and_follow_the_classes(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.step(f"{uid}.nobody", retry=RetryPolicy(max_attempts=3, retry_on=Transient))
    async def nobody(x: int) -> int:
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(nobody if x else f"{uid}.nobody2", x, timeout=0.2, retries=2)

    transport = InMemoryTransport()
    # Nobody serves either step: every attempt times out.
    async with engine_factory(transport=transport, steps=[]) as engine:
        for x in (1, 0):
            with pytest.raises(durably.RunFailedError):
                await engine.execute(wf, x, run_id=f"{uid}-r{x}", timeout=RESULT_TIMEOUT)
        [declared] = await engine.list_checkpoints(f"{uid}-r1")
        [plain] = await engine.list_checkpoints(f"{uid}-r0")
    # `retry_on=Transient`: a deadline (a TimeoutError) is not retried.
    assert [(e.attempt, e.code) for e in declared.attempt_errors or ()] == [(1, "timeout")]
    # No classes: retried up to the two attempts, both kept.
    assert [(e.attempt, e.code) for e in plain.attempt_errors or ()] == [
        (1, "timeout"),
        (2, "timeout"),
    ]


class _Refusing(InMemoryTransport):
    async def dispatch(self, task: RemoteTask) -> None:
        raise TransportUnavailableError("broker refused the connection")


async def test_refused_dispatches_join_the_history(engine_factory: EngineFactory, uid: str) -> None:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{uid}.x", x, retries=2)

    async with engine_factory(transport=_Refusing(), steps=[]) as engine:
        with pytest.raises(durably.RunFailedError):
            await engine.execute(wf, 1, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
        [row] = await engine.list_checkpoints(f"{uid}-r")
    assert [(e.attempt, e.code) for e in row.attempt_errors or ()] == [
        (1, "dispatch_failed"),
        (2, "dispatch_failed"),
    ]
