"""One run's live events, for `subscribe(run_id, listener)`: `RowWatches` in a store-only
process, `RunEventFilter` over an engine's event bus.

An engine's bus calls its listeners synchronously, from whichever thread emitted (a sync
step's thread too): `RunEventFilter` keeps the run's events, hops onto the subscriber's
loop and awaits a coroutine listener there, so a listener never runs on a step's thread
and a slow one never holds up the run.

Engine events exist only in the process that drives the run. A `Client` (no worker) that
is asked to `subscribe` to a run therefore re-reads the run's row every `poll` seconds and
turns each change of its status into the event the driving engine emits for it:
`run.started` (running again), `run.suspended`, `run.blocked`, `run.completed` (with the
output) and `run.failed` (failed, dead or cancelled — as an engine reports a cancel — with
the error). Changes quicker than the poll are seen as their last state; step events are not
seen at all. A watch lasts until it is unsubscribed or its client closed (a settled run may
be retried, and its subscriber then sees it run again).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from durably._core.log_context import durably_logger
from durably._core.models import WorkflowRun
from durably._engine.defs.events import EngineEvent, EngineEventType

if TYPE_CHECKING:
    from durably._store.protocol import StateStore

log = durably_logger("durably.client")

__all__ = ["WATCH_POLL_SECONDS", "RowWatches", "RunEventFilter"]

#: How often a client's run subscription re-reads the run's row.
WATCH_POLL_SECONDS = 1.0

_EVENT_OF_STATUS: dict[str, EngineEventType] = {
    "running": "run.started",
    "suspended": "run.suspended",
    "blocked": "run.blocked",
    "completed": "run.completed",
    "failed": "run.failed",
    "dead": "run.failed",
    "cancelled": "run.failed",
}


def event_of(run: WorkflowRun) -> EngineEvent | None:
    """The event the run's status stands for (None for `pending`: nothing happened yet)."""
    kind = _EVENT_OF_STATUS.get(run.status)
    if kind is None:
        return None
    return EngineEvent(
        type=kind,
        run_id=run.id,
        workflow=run.workflow,
        namespace=run.namespace,
        output=run.output if run.status == "completed" else None,
        error=run.error if kind in ("run.failed", "run.blocked") else None,
        at=run.updated_at,
    )


class RowWatches:
    """The row watches of one client: one task per subscription, all cancelled on close."""

    def __init__(self, store: StateStore, poll: float = WATCH_POLL_SECONDS):
        self._store = store
        self._poll = poll
        self._tasks: set[asyncio.Task[None]] = set()

    def watch(
        self, run_id: str, listener: Callable[[EngineEvent], Awaitable[None] | None]
    ) -> Callable[[], None]:
        """Start watching `run_id` for `listener`; returns the (idempotent) unsubscribe."""
        task = asyncio.get_running_loop().create_task(
            self._follow(run_id, listener), name=f"durably-watch-{run_id[:40]}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

        def unsubscribe() -> None:
            task.cancel()

        return unsubscribe

    async def close(self) -> None:
        tasks, self._tasks = set(self._tasks), set()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _follow(
        self, run_id: str, listener: Callable[[EngineEvent], Awaitable[None] | None]
    ) -> None:
        # The state at subscription time is the baseline: only later changes are events,
        # as a subscriber of an engine sees only what happens after it subscribed.
        seen: tuple[str, object] | None = None
        first = True
        while True:
            try:
                run = await self._store.get_run(run_id)
            except Exception as exc:  # the store is away: try again at the next poll
                log.debug("run watch of %s could not read the run: %s", run_id, exc)
                run = None
            if run is not None:
                now = (run.status, run.updated_at)
                if not first and now != seen:
                    event = event_of(run)
                    if event is not None:
                        await _call(listener, event)
                seen, first = now, False
            await asyncio.sleep(self._poll)


async def _call(
    listener: Callable[[EngineEvent], Awaitable[None] | None], event: EngineEvent
) -> None:
    try:
        outcome = listener(event)
        if inspect.isawaitable(outcome):
            await outcome
    except Exception:
        log.exception("run event listener failed")


class RunEventFilter:
    """An event-bus listener passing the events of `run_id` to `listener` on the loop it was
    made on (module description)."""

    def __init__(
        self, run_id: str, listener: Callable[[EngineEvent], Awaitable[None] | None]
    ) -> None:
        self._run_id = run_id
        self._listener = listener
        self._loop = asyncio.get_running_loop()
        # The latest delivery; each awaits the one before it, so the listener sees the
        # run's events in the order they were emitted.
        self._tail: asyncio.Task[None] | None = None

    def __call__(self, event: EngineEvent) -> None:
        if event.run_id != self._run_id or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event: EngineEvent) -> None:
        self._tail = self._loop.create_task(self._after(self._tail, event))

    async def _after(self, previous: asyncio.Task[None] | None, event: EngineEvent) -> None:
        if previous is not None:
            await asyncio.wait({previous})
        await _call(self._listener, event)
