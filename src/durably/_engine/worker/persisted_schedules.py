"""`PersistedScheduleFirer`: starts the runs of the schedules kept in the store.

Each tick of a driving engine's timer poll lists the records of its namespace that are due
(`next_fire_at <= now`, not paused), rebuilds each one's `Schedule`, and fires its windows
with the same `WindowFiring` as static schedules — the same window ids, overlap, catch-up and
jitter, and the same decisions kept in the record's state, each written compare-and-set on
`updated_at` before its run starts: several engines may list the same record, and the one
that loses a write re-reads the record and goes on from the winner's decisions.

A start that fails is written to the record's `last_error` and the tick goes on with the next
record; the window stays due, so the next tick tries it again. A record whose spec cannot be
read gets the reason in `last_error` and nothing due, and is left in the store for an
operator to fix or delete.

Store cost per tick: one listing of the due records (at most `TICK_BATCH`) for all of them;
a record is listed only when it has something to decide, or while a window is held.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from durably._core.log_context import durably_logger
from durably._core.schedules import ScheduleQuery, ScheduleRecord, ScheduleState, is_static_state
from durably._engine.defs.schedule_specs import schedule_from_record
from durably._engine.worker.schedules import WindowFiring
from durably._store.protocol import ScheduleStore

log = durably_logger("durably.schedules")

__all__ = ["TICK_BATCH", "PersistedScheduleFirer"]

# Records advanced per tick: a tick stays bounded however many schedules are due at once;
# the rest are still due at the next tick.
TICK_BATCH = 100


class PersistedScheduleFirer:
    """The persisted schedules of one namespace (None: every namespace), fired at each tick."""

    def __init__(
        self,
        store: ScheduleStore,
        *,
        firing: WindowFiring,
        clock: Callable[[], int],
        namespace: str | None,
    ):
        self._store = store
        self._firing = firing
        self._clock = clock
        self._namespace = namespace
        # The timer poll and an explicit `fire_schedules` may tick at once: one at a time,
        # or both would decide from the same listing.
        self._lock = asyncio.Lock()
        self._ticks = 0
        self._last: list[str] = []  # what the latest tick started

    async def tick(self) -> list[str]:
        """Fire every due record's windows; the run ids started this tick — and by the
        tick of this engine it waited for, if one was in progress (it took those windows)."""
        busy, seen = self._lock.locked(), self._ticks
        async with self._lock:
            earlier = self._last if busy and self._ticks == seen + 1 else []
            fired = await self._tick()
            self._ticks += 1
            self._last = fired
            return earlier + [r for r in fired if r not in earlier]

    async def _tick(self) -> list[str]:
        now = self._clock()
        try:
            due = await self._store.list_schedules(
                ScheduleQuery(
                    namespace=self._namespace, paused=False, due_before=now, limit=TICK_BATCH
                )
            )
        except Exception:
            # The store is unreachable for the moment: the rest of the poll pass still runs,
            # and the next tick lists the due records again.
            log.exception("durably could not list the due schedules; retrying next tick")
            return []
        fired: list[str] = []
        for record in due:
            if is_static_state(record.id):
                continue  # never due (written so); fired by the engines declaring it
            try:
                await self._advance(record, now, fired)
            except Exception:
                # A store hiccup writing one record must not stop the others; the record is
                # still due, so the next tick takes it again.
                log.exception("durably schedule %r could not be advanced", record.id)
        return fired

    async def _advance(self, record: ScheduleRecord, now: int, fired: list[str]) -> None:
        try:
            schedule = schedule_from_record(record)
        except ValueError as exc:
            state = ScheduleState(**record.state)
            state["last_error"] = str(exc)
            await self._store.put_schedule(
                dataclasses.replace(
                    record,
                    next_fire_at=None,
                    updated_at=max(now, record.updated_at + 1),
                    state=state,
                ),
                expected_updated_at=record.updated_at,
            )
            log.error("durably %s", exc)
            return
        try:
            await self._firing.fire(schedule, record, now, fired, namespace=record.namespace)
        except Exception as exc:
            # Written to the record's `last_error` by the firing; logged once per new error.
            error = f"{type(exc).__name__}: {exc}"
            if error != record.state.get("last_error"):
                log.warning("durably schedule %r failed to start a run: %s", record.id, error)
