"""`ScheduleFirer`: starts the runs of an engine's static schedules from its timer poll.

Every tick computes, from the engine's clock, the windows each schedule is due to fire and
starts their runs by their window ids (`sched:<id>:<window start>`). A start is idempotent by
run id, so ticking twice in one window, or several engines ticking together, starts each
window at most once.

`WindowFiring` is the per-schedule decision — which windows are due, what overlap does with
a live run, jitter's delayed start — and it keeps every decision in the store, in a schedule
record's `state`, so that all engines share it: a persisted schedule's own record, and for a
static schedule a state-only record (`static_state_id`: `static:<id>`, which no persisted id
can be; listing and describing schedules leave it out, and it is never due to the persisted
firer). Each engine fires a static schedule from its own declaration: the record holds
firing state only, never the options, so engines declaring it alike share the state and
never overwrite each other's declaration.

The state holds the latest window already decided (started, skipped or held), the window
held by "buffer_one", the run last started and a start decided but not yet confirmed. A tick
decides only windows after the decided one, one decision at a time, each written with a
compare-and-set on the record's `updated_at` BEFORE the run is started: an engine that loses
the race re-reads the record and goes on from the winner's decisions, so two engines never
decide one window differently (one skipping it, the other starting it). "Live" is the run the
schedule last started, whoever started it (the state names it), still not terminal; with
skip or buffer_one at most one timetable run is live at a time, so that one run is all there
is to ask about.

Store cost per schedule and tick: nothing for a static schedule whose windows up to now this
engine already saw decided (floors only move forward, so its last read still holds); else
one read of the record. Deciding a window is one conditional write, plus one read of the
last run when overlap is not "allow", plus the start and one write confirming it. While a
window is held, each tick reads the live run (a static schedule works from its last copy of
the record; a persisted one is listed as due); while a start is unconfirmed, each tick reads
the record.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from durably._core.log_context import durably_logger
from durably._core.models import WorkflowRun
from durably._core.schedules import (
    RECENT_RUNS_KEPT,
    ScheduleRecord,
    ScheduleSpec,
    ScheduleState,
    is_static_state,
    static_state_id,
)
from durably._engine.client.schedule_views import window_of_run
from durably._engine.defs.schedule_specs import next_due
from durably._engine.defs.schedules import Schedule, window_run_id
from durably._store.protocol import ScheduleStore

log = durably_logger("durably.schedules")

StartRun = Callable[[Schedule, str, str | None], Awaitable[Any]]
"""`start(schedule, run_id, namespace)`: start the window's run, idempotently by its id, in
`namespace` (None: the engine's own)."""
GetRun = Callable[[str], Awaitable[WorkflowRun | None]]

# Decisions one tick makes for one schedule at most: each window of a catch-up, the held
# window, a retried start, and the writes lost to other engines in between. Whatever is left
# is still due at the next tick.
_MAX_STEPS = 64
# Fresh reads a confirmation (or an error report) tries before leaving it to the next tick.
_WRITE_ATTEMPTS = 10


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Firing:
    """The firing state a record holds (untrusted values read as none).

    `floor`: the latest window decided (None: every window `Schedule.windows` names is a
    candidate); `held`: the window "buffer_one" holds; `last`: the run last started;
    `starting`: a start decided and not confirmed yet."""

    floor: int | None
    held: int | None
    last: str | None
    starting: str | None

    @classmethod
    def of(cls, state: ScheduleState) -> Firing:
        return cls(
            floor=_whole(state.get("last_window")),
            held=_whole(state.get("held_window")),
            last=_text(state.get("last_run_id")),
            starting=_text(state.get("starting")),
        )


def due_of(schedule: Schedule, now: int, state: ScheduleState) -> int | None:
    """When a tick next has something to do for a schedule in `state`: at once while a start
    is unconfirmed or a window held, else `next_due`."""
    firing = Firing.of(state)
    if firing.starting is not None and not schedule.paused:
        return now
    return next_due(schedule, now, firing.floor, firing.held)


def _changed(state: ScheduleState, **changes: Any) -> ScheduleState:
    new = ScheduleState(**state)
    new.update(changes)  # type: ignore[typeddict-item]
    return new


def _declaration(record: ScheduleRecord) -> tuple[object, ...]:
    """What a record's `Schedule` is built from (a static state record's never changes)."""
    return (record.workflow, record.paused, record.spec)


@dataclass(frozen=True)
class _Step:
    """One decision: the state to write (None: nothing to write), then the run to start."""

    state: ScheduleState | None
    start: str | None = None


class WindowFiring:
    """Fires one schedule's due windows at a given instant, deciding them in its record."""

    def __init__(self, *, store: ScheduleStore, start: StartRun, get_run: GetRun):
        self._store = store
        self._start = start
        self._get_run = get_run

    async def fire(
        self,
        schedule: Schedule,
        record: ScheduleRecord,
        now: int,
        fired: list[str],
        *,
        namespace: str | None = None,
    ) -> ScheduleRecord | None:
        """Decide every window of `schedule` due at `now` (oldest first) in `record` and
        start the ones decided started; their run ids are appended to `fired` as they start
        (a caller still knows them when a later start raises). A window whose jittered start
        (`Schedule.due_at`) is still ahead waits for a later tick: nothing sleeps here. Runs
        start in `namespace` (None: the engine's). Returns the record as last read or
        written (None: it was deleted meanwhile). A failed start is written to the record's
        `last_error` and raised."""
        current = record
        retry = True  # a start left unconfirmed before this tick may be tried again
        live: set[str] = set(fired)  # runs this tick found (or made) live: asked once
        for _ in range(_MAX_STEPS):
            step = await self._next_step(schedule, current, now, live, retry=retry)
            if step is None:
                break
            if step.state is not None:
                written = await self._put(schedule, current, step.state, now)
                if written is None:
                    # Lost the race: another engine (or a client) wrote first, and its
                    # decisions stand. Go on from them, leaving any start it has in flight
                    # to it.
                    fresh = await self._store.get_schedule(current.id)
                    if fresh is None:
                        return None
                    if _declaration(fresh) != _declaration(current):
                        return fresh  # changed (or paused) by a client: the next tick reads it
                    current, retry = fresh, False
                    if step.start is not None and Firing.of(fresh.state).last == step.start:
                        # The winner decided the same start: the window's run is reported
                        # here as well (it is the winner's to start and confirm).
                        fired.append(step.start)
                        live.add(step.start)
                    continue
                current = written
            if step.start is not None:
                retry = False  # once per tick
                confirmed = await self._start_run(schedule, current, step.start, now, namespace)
                if confirmed is None:
                    return None
                current = confirmed
                fired.append(step.start)
                live.add(step.start)
        else:
            return current
        return await self._refresh(schedule, current, now)

    async def run_exists(self, run_id: str) -> bool:
        return await self._get_run(run_id) is not None

    async def _next_step(
        self, schedule: Schedule, record: ScheduleRecord, now: int, live: set[str], *, retry: bool
    ) -> _Step | None:
        state = record.state
        firing = Firing.of(state)
        windows = schedule.windows(now)
        if firing.starting is not None:
            window = window_of_run(schedule.id, firing.starting)
            if window is not None and windows and window >= windows[0]:
                # Decided, not confirmed: start it again (idempotently) — unless this tick
                # lost a race to the engine deciding it, whose start is in flight.
                return _Step(None, firing.starting) if retry else None
            # Its window is past what a tick still fires: missed, as a window no engine
            # ticked in.
            return _Step(_changed(state, starting=None))
        held = firing.held
        if held is not None and schedule.overlap != "buffer_one":
            return _Step(_changed(state, held_window=None))  # the overlap was changed
        candidates: list[int] = []
        for window in windows:
            if firing.floor is not None and window <= firing.floor:
                continue
            if now < schedule.due_at(window):
                break  # later windows start later still
            candidates.append(window)
        if not candidates and held is None:
            return None
        if schedule.overlap == "allow":
            return self._start_step(schedule, state, firing, candidates[0])
        is_live = await self._live(firing, live)
        if schedule.overlap == "skip":
            if is_live:
                # Every due window is decided at once: skipped for good, never started late.
                latest = candidates[-1]
                return _Step(_changed(state, last_window=latest, skipped_window=latest))
            return self._start_step(schedule, state, firing, candidates[0])
        if is_live:
            if not candidates:
                return None  # the held window waits for the live run to end
            latest = candidates[-1]  # only the latest held window is kept
            return _Step(_changed(state, last_window=latest, held_window=latest))
        # Nothing live: the oldest due window starts (a newer due window supersedes a held
        # one: a queue never builds behind a long run), else the held window.
        window = candidates[0] if candidates else held
        assert window is not None
        return self._start_step(schedule, state, firing, window)

    def _start_step(
        self, schedule: Schedule, state: ScheduleState, firing: Firing, window: int
    ) -> _Step:
        run_id = window_run_id(schedule.id, window)
        floor = window if firing.floor is None else max(firing.floor, window)
        return _Step(
            _changed(
                state, last_window=floor, held_window=None, last_run_id=run_id, starting=run_id
            ),
            run_id,
        )

    async def _live(self, firing: Firing, live: set[str]) -> bool:
        """Whether the run the schedule last started (whichever engine started it) is live;
        `live`: the runs this tick already found live or started (a run found live is taken
        as live for the rest of the tick: at worst a window is held rather than started)."""
        if firing.last is None:
            return False
        if firing.last in live:
            return True
        run = await self._get_run(firing.last)
        if run is None or run.is_terminal:
            return False
        live.add(firing.last)
        return True

    async def _start_run(
        self,
        schedule: Schedule,
        record: ScheduleRecord,
        run_id: str,
        now: int,
        namespace: str | None,
    ) -> ScheduleRecord | None:
        try:
            await self._start(schedule, run_id, namespace)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            await self._update(schedule, record, now, lambda s: _changed(s, last_error=error))
            raise

        def confirmed(state: ScheduleState) -> ScheduleState | None:
            if state.get("starting") != run_id:
                return None  # another engine confirmed it (or it was given up)
            recent = [r for r in state.get("recent_runs") or [] if isinstance(r, str)]
            count = _whole(state.get("fired_count")) or 0
            return _changed(
                state,
                starting=None,
                last_error=None,
                last_fire_at=now,
                fired_count=count + 1,
                recent_runs=([run_id] + [r for r in recent if r != run_id])[:RECENT_RUNS_KEPT],
            )

        return await self._update(schedule, record, now, confirmed)

    async def _update(
        self,
        schedule: Schedule,
        record: ScheduleRecord,
        now: int,
        change: Callable[[ScheduleState], ScheduleState | None],
    ) -> ScheduleRecord | None:
        """Apply `change` to the record's state, again on a fresh read while other writes
        come in between; the record as last read or written (None: deleted)."""
        current = record
        for _ in range(_WRITE_ATTEMPTS):
            state = change(current.state)
            if state is None:
                return current
            written = await self._put(schedule, current, state, now)
            if written is not None:
                return written
            fresh = await self._store.get_schedule(current.id)
            if fresh is None:
                return None
            current = fresh
        return current  # left to the next tick (an unconfirmed start is retried)

    async def _refresh(
        self, schedule: Schedule, record: ScheduleRecord, now: int
    ) -> ScheduleRecord | None:
        """A persisted record listed as due with nothing to decide gets its `next_fire_at`
        moved ahead, so later ticks stop listing it."""
        if is_static_state(record.id):
            return record
        due = due_of(schedule, now, record.state)
        if due is None or due > now:
            if record.next_fire_at != due:
                written = await self._put(schedule, record, record.state, now)
                return record if written is None else written
        return record

    async def _put(
        self, schedule: Schedule, record: ScheduleRecord, state: ScheduleState, now: int
    ) -> ScheduleRecord | None:
        # A static schedule's state record is never due to the persisted firer: static
        # schedules are fired by the engines declaring them. A record paused meanwhile (this
        # write is a confirmation) stays not due: unpausing sets when it is.
        listed = not (is_static_state(record.id) or record.paused)
        due = due_of(schedule, now, state) if listed else None
        advanced = dataclasses.replace(
            record, next_fire_at=due, updated_at=max(now, record.updated_at + 1), state=state
        )
        won = await self._store.put_schedule(advanced, expected_updated_at=record.updated_at)
        return advanced if won else None


class ScheduleFirer:
    """The static schedules of one engine, fired at each tick of its timer poll."""

    def __init__(
        self,
        schedules: Sequence[Schedule],
        *,
        firing: WindowFiring,
        store: ScheduleStore,
        clock: Callable[[], int],
        namespace: str | None,
    ):
        self._schedules = list(schedules)
        self._firing = firing
        self._store = store
        self._clock = clock
        self._home = namespace or "default"
        # Per schedule, when it is next due as of the state this engine last read or wrote:
        # before then there is nothing to decide, so the tick does not read the record.
        self._due: dict[str, int | None] = {}
        # Per schedule holding a window, the record as this engine last read or wrote it: a
        # tick while the window is held asks only whether the live run has ended. The copy
        # may be stale, which costs a lost compare-and-set and a fresh read, never a wrong
        # decision (every decision is written compare-and-set).
        self._holding: dict[str, ScheduleRecord] = {}
        # The timer poll and an explicit `fire_schedules` may tick at once: one at a time,
        # or both would decide from the same read.
        self._lock = asyncio.Lock()

    @property
    def schedules(self) -> list[Schedule]:
        return list(self._schedules)

    async def tick(self, *, report: bool = False) -> list[str]:
        """Fire every due window; returns the run ids started this tick. With `report` (an
        explicit `fire_schedules`), the runs of every due window instead, whichever tick
        started them: up to one run lookup per window of `Schedule.windows`."""
        async with self._lock:
            out: list[str] = []
            now = self._clock()
            for schedule in self._schedules:
                if schedule.paused:
                    continue
                fired: list[str] = []
                due = self._due.get(schedule.id)
                try:
                    if due is None or due <= now:
                        record = self._holding.pop(schedule.id, None)
                        if record is None:
                            record = await self._record(schedule, now)
                        after = await self._firing.fire(schedule, record, now, fired)
                        self._due[schedule.id] = (
                            None if after is None else due_of(schedule, now, after.state)
                        )
                        if after is not None and Firing.of(after.state).held is not None:
                            self._holding[schedule.id] = after
                    out.extend(await self._due_runs(schedule, now, fired) if report else fired)
                except Exception:
                    # One schedule's failure (a start refused, a store hiccup) must not stop
                    # the others: this schedule tries again at the next tick.
                    self._due.pop(schedule.id, None)
                    log.exception(
                        "durably schedule %r failed to fire; retrying next tick", schedule.id
                    )
            return out

    async def _due_runs(self, schedule: Schedule, now: int, fired: list[str]) -> list[str]:
        """The runs of the windows due at `now`, oldest first: started by this tick, or
        found in the store."""
        found: list[str] = []
        for window in schedule.windows(now):
            if now < schedule.due_at(window):
                break
            run_id = window_run_id(schedule.id, window)
            if run_id in fired or await self._firing.run_exists(run_id):
                found.append(run_id)
        return found

    async def _record(self, schedule: Schedule, now: int) -> ScheduleRecord:
        """The schedule's state record, created empty the first time any engine fires it
        (every window of `Schedule.windows` is then a candidate, as after downtime)."""
        record_id = static_state_id(schedule.id)
        for _ in range(_WRITE_ATTEMPTS):
            found = await self._store.get_schedule(record_id)
            if found is not None:
                return found
            fresh = ScheduleRecord(
                id=record_id,
                workflow=schedule.workflow_name,
                namespace=self._home,
                created_at=now,
                updated_at=now,
                spec=ScheduleSpec(),
                state=ScheduleState(),
            )
            if await self._store.put_schedule(fresh, if_absent=True):
                return fresh
        raise RuntimeError(f"the state record of schedule {schedule.id!r} kept changing")
