"""Wake-ups between engines sharing one store (`WakeBus` in _store/protocol.py).

On PostgreSQL the store's bus is LISTEN/NOTIFY; engines sharing an in-memory store object
share an in-process bus; SQLite has none (polling only). Messages are hints: every engine
still polls, so a lost message costs latency, never correctness.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from durably._core.log_context import durably_logger
from durably._engine.worker.runs import BackgroundTasks, DriveState, ExecutingRuns
from durably._store.protocol import WakeBus

if TYPE_CHECKING:
    from durably._store.protocol import WakeSource

log = durably_logger("durably.worker")


class WakeRuns(ExecutingRuns, DriveState, BackgroundTasks, Protocol):
    """What a wake message asks of the runs here: is the run resident (woken in memory),
    may this process pick work up now, and where publishing and the pick-up run."""


class WakeLink:
    """One engine's end of the store's wake bus.

    `settled` messages wake this process's `wait_for_run` calls (`on_settled`); any other
    message wakes the run if it is parked here, else starts one pick-up pass (`pickup`: the
    poller's claim of pending runs and due timers).
    """

    def __init__(
        self,
        store: WakeSource,
        runs: WakeRuns,
        *,
        on_settled: Callable[[str], None],
        pickup: Callable[[], Awaitable[None]],
    ):
        self._store = store
        self._runs = runs
        self._on_settled = on_settled
        self._pickup = pickup
        self._bus: WakeBus | None = None
        self._kick_scheduled = False

    @property
    def active(self) -> bool:
        return self._bus is not None

    async def open(self) -> None:
        bus = self._store.wake_bus()  # None: the store has no cross-process channel
        if bus is not None:
            await bus.start(self._on_wake)
            self._bus = bus

    async def close(self) -> None:
        bus, self._bus = self._bus, None
        if bus is not None:
            try:
                await bus.close()
            except Exception:
                log.debug("closing the wake bus failed", exc_info=True)

    async def announce(self, kind: str, run_id: str) -> None:
        """Tell the other engines; best effort (a failed publish only costs latency)."""
        if self._bus is None:
            return
        try:
            await self._bus.publish(kind, run_id)
        except Exception:
            log.debug("wake-bus publish of %s:%s failed", kind, run_id, exc_info=True)

    def announce_soon(self, kind: str, run_id: str) -> None:
        if self._bus is not None:
            self._runs.spawn(self.announce(kind, run_id))

    def _on_wake(self, kind: str, run_id: str) -> None:
        if kind == "settled":
            self._on_settled(run_id)
            return
        execution = self._runs.execution(run_id)
        if execution is not None:
            if execution.resident:
                execution.deliver(None, None)  # re-check what it waits for
            return
        self.kick()

    def kick(self) -> None:
        """Pick up runnable work now instead of at the next poll; a burst of wake messages
        costs one pick-up pass (claim pending runs, then due timers)."""
        runs = self._runs
        if self._kick_scheduled or not runs.drive_runs or runs.draining:
            return
        self._kick_scheduled = True

        async def pickup() -> None:
            await asyncio.sleep(0)  # let the rest of the burst arrive first
            self._kick_scheduled = False
            await self._pickup()

        runs.spawn(pickup())
