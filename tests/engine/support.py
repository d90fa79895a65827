"""Small helpers shared by the engine suite."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from durably import Engine, EngineEvent, StepCheckpoint, WorkflowRun

RESULT_TIMEOUT = 10.0


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], *, timeout: float = RESULT_TIMEOUT
) -> None:
    """Poll an async predicate until it holds (fails the test on timeout)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.01)


async def wait_status(
    engine: Engine, run_id: str, *statuses: str, timeout: float = RESULT_TIMEOUT
) -> WorkflowRun:
    """Wait until the run exists and has one of `statuses`; returns the row."""
    found: list[WorkflowRun] = []

    async def check() -> bool:
        run = await engine.get_run(run_id)
        if run is not None and run.status in statuses:
            found.append(run)
            return True
        return False

    await wait_until(check, timeout=timeout)
    return found[-1]


async def wait_suspended(engine: Engine, run_id: str) -> WorkflowRun:
    """Wait until the run is settled `suspended` (via the handle, then a store read)."""
    run = await engine.handle(run_id).wait(timeout=RESULT_TIMEOUT)
    assert run.status == "suspended", run
    fresh = await engine.get_run(run_id)
    assert fresh is not None
    return fresh


def turn_ended(engine: Engine, run_id: str) -> bool:
    """No turn of the run is executing on this engine: either it is not driven here (a
    classic turn ended) or its resident body is parked."""
    return not engine._worker.turn_running(run_id)


async def wait_waiting_on(engine: Engine, run_id: str, token: str) -> None:
    """Wait until the run has registered a signal waiter on `token`, is suspended and its
    turn has ended (so a delivery does not race the end of the turn)."""

    async def check() -> bool:
        waiters = await engine.store.list_signal_waiters(token)
        run = await engine.get_run(run_id)
        return (
            any(w.run_id == run_id for w in waiters)
            and run is not None
            and run.status == "suspended"
            and turn_ended(engine, run_id)
        )

    await wait_until(check)


def shape(checkpoints: list[StepCheckpoint]) -> list[tuple[int, str, str, str]]:
    """(seq, name, kind, status) of every checkpoint: the mode-independent history shape."""
    return [(cp.seq, cp.name, cp.kind, cp.status) for cp in checkpoints]


class EventLog:
    """Collects EngineEvents of one engine (`engine.subscribe`)."""

    def __init__(self, engine: Engine):
        self.events: list[EngineEvent] = []
        self.unsubscribe = engine.subscribe(self.events.append)

    def of(self, run_id: str, *types: str) -> list[EngineEvent]:
        return [e for e in self.events if e.run_id == run_id and (not types or e.type in types)]

    def types(self, run_id: str) -> list[str]:
        return [e.type for e in self.of(run_id)]


def bump(counts: dict[str, int], key: str) -> int:
    counts[key] = counts.get(key, 0) + 1
    return counts[key]


__all__ = [
    "RESULT_TIMEOUT",
    "EventLog",
    "bump",
    "shape",
    "turn_ended",
    "wait_status",
    "wait_suspended",
    "wait_until",
    "wait_waiting_on",
]
