"""`PersistedScheduleFirer`: starts the runs of the schedules kept in the store.

Each tick of a driving engine's timer poll lists the records of its namespace that are due
(`next_fire_at <= now`, not paused), rebuilds each one's `Schedule`, and fires its windows
with the same `WindowFiring` as static schedules — the same window ids, overlap, catch-up and
jitter. The run id is what makes a window fire once: several engines may list the same record
and start the same ids, and only one run exists per id. Each then advances the record (its
`next_fire_at` and state) with a compare-and-set on `updated_at`; the engine that loses the
race drops its write, as the winner recorded the same windows.

A start that fails is written to the record's `last_error` and the tick goes on with the next
record; the window stays due, so the next tick tries it again. A record whose spec cannot be
read gets the reason in `last_error` and nothing due, and is left in the store for an
operator to fix or delete.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from durably._core.log_context import durably_logger
from durably._core.schedules import (
    RECENT_RUNS_KEPT,
    ScheduleQuery,
    ScheduleRecord,
    ScheduleState,
)
from durably._engine.defs.schedule_specs import next_due, schedule_from_record
from durably._engine.worker.schedules import FireMemory, WindowFiring
from durably._store.protocol import ScheduleStore

log = durably_logger("durably.schedules")

__all__ = ["PersistedScheduleFirer", "advanced_state", "memory_of"]

# Records advanced per tick: a tick stays bounded however many schedules are due at once;
# the rest are still due at the next tick.
TICK_BATCH = 100


def memory_of(state: ScheduleState) -> FireMemory:
    """The firing memory a record's state holds (untrusted values read as none)."""

    def whole(value: object) -> int | None:
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    last = state.get("last_run_id")
    return FireMemory(
        last=last if isinstance(last, str) else None,
        held=whole(state.get("held_window")),
        skipped=whole(state.get("skipped_window")),
        floor=whole(state.get("last_window")),
    )


def advanced_state(
    state: ScheduleState,
    memory: FireMemory,
    fired: list[str],
    *,
    now: int,
    error: str | None,
) -> ScheduleState:
    """The state after a tick that started `fired` (oldest first) and ended with `error`."""
    new = ScheduleState(**state)
    new["last_window"] = memory.floor
    new["held_window"] = memory.held
    new["skipped_window"] = memory.skipped
    if fired:
        recent = [r for r in state.get("recent_runs") or [] if isinstance(r, str)]
        new["recent_runs"] = (fired[::-1] + [r for r in recent if r not in fired])[
            :RECENT_RUNS_KEPT
        ]
        new["last_run_id"] = fired[-1]
        new["last_fire_at"] = now
        count = state.get("fired_count")
        new["fired_count"] = (count if isinstance(count, int) else 0) + len(fired)
    elif memory.last is not None:
        new["last_run_id"] = memory.last
    new["last_error"] = error
    return new


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

    async def tick(self) -> list[str]:
        """Fire every due record's windows; the run ids started (or found started)."""
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
            try:
                fired.extend(await self._advance(record, now))
            except Exception:
                # A store hiccup writing one record must not stop the others; the record is
                # still due, so the next tick takes it again.
                log.exception("durably schedule %r could not be advanced", record.id)
        return fired

    async def _advance(self, record: ScheduleRecord, now: int) -> list[str]:
        try:
            schedule = schedule_from_record(record)
        except ValueError as exc:
            state = ScheduleState(**record.state)
            state["last_error"] = str(exc)
            await self._write(record, now, None, state)
            log.error("durably %s", exc)
            return []
        memory = memory_of(record.state)
        fired: list[str] = []
        error: str | None = None
        try:
            await self._firing.fire(schedule, now, memory, fired, namespace=record.namespace)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            if error != record.state.get("last_error"):
                log.warning("durably schedule %r failed to start a run: %s", record.id, error)
        state = advanced_state(record.state, memory, fired, now=now, error=error)
        await self._write(record, now, next_due(schedule, now, memory.floor, memory.held), state)
        return fired

    async def _write(
        self, record: ScheduleRecord, now: int, next_fire_at: int | None, state: ScheduleState
    ) -> bool:
        advanced = dataclasses.replace(
            record,
            next_fire_at=next_fire_at,
            updated_at=max(now, record.updated_at + 1),
            state=state,
        )
        # Lost: another engine advanced the record from the same read (and recorded the same
        # windows), or a client changed it; either way its write stands.
        return await self._store.put_schedule(advanced, expected_updated_at=record.updated_at)
