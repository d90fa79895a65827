"""Lost dispatches heal themselves (`remote_redispatch_ms` / `remote_redispatch_max`).

The orchestrator serves no steps; a worker double consumes the step's queue on the real
in-memory broker and loses the tasks it is told to (a worker that died holding them). With
the option set, the step still pending after the window is sent again as its next attempt
and the run completes; without it the step stays pending; past the max it fails as lost; and
the lost dispatch's late answer does not settle the row a second time. Each test runs on
memory and SQLite, resident and replay (tests/engine_support.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import durably
from durably import WorkflowCtx
from durably._core.wire import RemoteTask, StepResult
from durably.transports import InMemoryBroker, InMemoryTransport
from tests.engine_support import EngineFactory

RESULT_TIMEOUT = 20
WINDOW_MS = 150


async def wait_until(predicate: Callable[[], bool], timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # noqa: ASYNC110 - polls a plain list, not an event
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def worker(
    broker: InMemoryBroker, token: str, *, lose: int, seen: list[RemoteTask]
) -> AsyncIterator[None]:
    """A worker double on `token`: it loses the first `lose` tasks it takes (never answers
    them) and answers the others with their input doubled, naming the attempt it ran."""

    async def serve() -> None:
        queue = broker.queue(token)
        while True:
            task = await queue.get()
            seen.append(task)
            if len(seen) <= lose:
                continue
            broker.publish_result(
                StepResult(
                    run_id=task.run_id,
                    seq=task.seq,
                    step_id=task.step_id,
                    status="completed",
                    output=task.input * 2 if isinstance(task.input, int) else None,
                    attempt=task.attempt,
                )
            )

    runner = asyncio.create_task(serve())
    try:
        yield
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


def _workflow(uid: str) -> Any:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{uid}.double", x)

    return wf


async def test_a_lost_dispatch_is_sent_again_and_the_run_completes(
    engine_factory: EngineFactory, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    wf = _workflow(uid)
    broker = InMemoryBroker()
    seen: list[RemoteTask] = []
    caplog.set_level(logging.INFO, logger="durably")
    async with (
        engine_factory(
            transport=InMemoryTransport(broker), steps=[], remote_redispatch_ms=WINDOW_MS
        ) as engine,
        worker(broker, f"{uid}.double", lose=1, seen=seen),
    ):
        assert await engine.execute(wf, 4, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 8
        rows = await engine.list_checkpoints(f"{uid}-r")
    assert [(t.step_id, t.attempt) for t in seen] == [(f"{uid}-r:0", 1), (f"{uid}-r:0", 2)]
    assert [(r.status, r.output, r.attempts) for r in rows] == [("completed", 8, 2)]
    healed = [r.getMessage() for r in caplog.records if "re-dispatched" in r.getMessage()]
    assert len(healed) == 1, healed
    assert healed[0].startswith(f"run {uid}-r: step {uid}.double (seq 0)")
    assert f"on {uid}.double as attempt 2" in healed[0]
    assert all(r.levelno == logging.INFO for r in caplog.records if "re-dispatched" in r.message)


async def test_without_the_option_a_lost_dispatch_stays_pending(
    engine_factory: EngineFactory, uid: str
) -> None:
    wf = _workflow(uid)
    broker = InMemoryBroker()
    seen: list[RemoteTask] = []
    async with (
        engine_factory(transport=InMemoryTransport(broker), steps=[]) as engine,
        worker(broker, f"{uid}.double", lose=1, seen=seen),
    ):
        handle = await engine.start(wf, 4, run_id=f"{uid}-r")
        await wait_until(lambda: bool(seen))
        # Several windows of the other tests pass, with the poller running every 20 ms.
        await asyncio.sleep(WINDOW_MS * 4 / 1000)
        rows = await engine.list_checkpoints(handle.run_id)
        run = await engine.get_run(handle.run_id)
    assert [t.attempt for t in seen] == [1]
    assert [(r.status, r.attempts) for r in rows] == [("pending", 1)]
    assert run is not None and not run.is_terminal


async def test_past_the_max_the_step_fails_as_lost(engine_factory: EngineFactory, uid: str) -> None:
    wf = _workflow(uid)
    broker = InMemoryBroker()
    seen: list[RemoteTask] = []
    async with (
        engine_factory(
            transport=InMemoryTransport(broker),
            steps=[],
            remote_redispatch_ms=WINDOW_MS,
            remote_redispatch_max=2,
        ) as engine,
        worker(broker, f"{uid}.double", lose=100, seen=seen),
    ):
        with pytest.raises(durably.RunFailedError) as info:
            await engine.execute(wf, 4, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
        rows = await engine.list_checkpoints(f"{uid}-r")
    error = info.value.error
    assert error is not None and error.code == "remote_step_lost", error
    assert "no result after 2 re-dispatches" in error.message
    assert [t.attempt for t in seen] == [1, 2, 3]  # the dispatch and two re-dispatches
    assert [(r.status, r.attempts) for r in rows] == [("failed", 3)]


async def test_the_late_answer_of_the_lost_dispatch_settles_nothing(
    engine_factory: EngineFactory, uid: str
) -> None:
    wf = _workflow(uid)
    broker = InMemoryBroker()
    seen: list[RemoteTask] = []
    async with (
        engine_factory(
            transport=InMemoryTransport(broker), steps=[], remote_redispatch_ms=WINDOW_MS
        ) as engine,
        worker(broker, f"{uid}.double", lose=1, seen=seen),
    ):
        assert await engine.execute(wf, 4, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 8
        first = seen[0]
        # The worker that held the first task was only slow: its answer comes in now.
        broker.publish_result(
            StepResult(
                run_id=first.run_id,
                seq=first.seq,
                step_id=first.step_id,
                status="completed",
                output=-1,
                attempt=first.attempt,
            )
        )
        await wait_until(lambda: broker.results.empty())
        await asyncio.sleep(0.1)  # the consumer settles the batch it took
        rows = await engine.list_checkpoints(f"{uid}-r")
        run = await engine.get_run(f"{uid}-r")
    assert [(r.status, r.output, r.attempts) for r in rows] == [("completed", 8, 2)]
    assert run is not None and run.output == 8


async def test_an_in_process_step_is_never_redispatched(
    engine_factory: EngineFactory, uid: str
) -> None:
    calls: list[int] = []

    @durably.step(f"{uid}.slow")
    async def slow(x: int) -> int:
        calls.append(x)
        await asyncio.sleep(WINDOW_MS * 3 / 1000)
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(slow, x)

    async with engine_factory(steps=[slow], remote_redispatch_ms=WINDOW_MS) as engine:
        assert await engine.execute(wf, 3, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 3
    assert calls == [3]
