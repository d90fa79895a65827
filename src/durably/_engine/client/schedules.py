"""`ScheduleClient` (`client.schedules`, `engine.schedules`): schedules created, changed,
paused, triggered, backfilled and deleted at run time, kept in the store.

A persisted schedule is a `durably.Schedule` written as a record (`durably._core.schedules`);
every driving engine of its namespace fires it from its timer poll, with the same window ids
as a schedule declared in code (`sched:<id>:<window start ms>`), so a window starts once
however many engines tick. An engine's own static schedules (`Engine(schedules=...)`) are
listed and described beside the persisted ones (`source="static"`), and their ids are taken:
a persisted schedule cannot shadow one. What is declared in code is changed in code, so
pausing, updating or deleting a static schedule is refused with an error saying so.

Writes to an existing record are compare-and-set on its `updated_at`, retried on a fresh read
when an engine advanced the record in between, so a change never overwrites what a tick
recorded (or the reverse).
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from durably._core.errors import ScheduleAlreadyExistsError, ScheduleNotFoundError
from durably._core.ids import validate_run_id
from durably._core.jsonutil import dumps
from durably._core.log_context import durably_logger
from durably._core.schedules import (
    RECENT_RUNS_KEPT,
    ScheduleQuery,
    ScheduleRecord,
    ScheduleState,
    is_static_state,
)
from durably._engine.client.handle import RunHandle
from durably._engine.client.schedule_views import (
    ScheduleDescription,
    ScheduleRunSummary,
    window_of_run,
)
from durably._engine.defs.schedule_specs import (
    initial_floor,
    next_due,
    schedule_from_record,
    schedule_spec,
)
from durably._engine.defs.schedules import Schedule, window_run_id
from durably._store.protocol import RunStore, ScheduleStore

log = durably_logger("durably.schedules")

__all__ = [
    "BACKFILL_MAX_WINDOWS",
    "NEXT_FIRES",
    "ScheduleClient",
    "ScheduleClientStore",
    "ScheduleStarts",
    "StartsBy",
    "manual_run_id",
]

#: The most windows one `backfill` starts.
BACKFILL_MAX_WINDOWS = 10_000
#: How many future window starts a description lists.
NEXT_FIRES = 5
# Fresh reads of a record a write tries before giving up (each lost to a concurrent write).
_WRITE_ATTEMPTS = 20
_LIST_MAX = 1_000
_FIELDS = tuple(f.name for f in dataclasses.fields(Schedule) if f.name != "id")


def manual_run_id(schedule_id: str, now_ms: int) -> str:
    """The id of a run `trigger` starts: never a window's id (`:manual:` cannot be a window)."""
    return f"sched:{schedule_id}:manual:{now_ms}"


class ScheduleClientStore(ScheduleStore, RunStore, Protocol):
    """The records, and the runs a description reports the status of."""


class ScheduleStarts(Protocol):
    """How the schedule client's host starts a schedule's run and checks its workflow."""

    async def start_run(self, schedule: Schedule, run_id: str, namespace: str) -> RunHandle[Any]:
        """Start (idempotently, by id) the run of `schedule` with `run_id` in `namespace`."""
        ...

    async def check_workflow(self, name: str, namespace: str) -> None:
        """Raise `WorkflowNotFoundError` when the host can tell nothing will run `name`."""
        ...


StartRun = Callable[[Schedule, str, str], Awaitable[RunHandle[Any]]]
CheckWorkflow = Callable[[str, str], Awaitable[None]]


class StartsBy:
    """`ScheduleStarts` from two functions: `start(schedule, run_id, namespace)` and
    `check(workflow name, namespace)`."""

    def __init__(self, *, start: StartRun, check: CheckWorkflow):
        self._start = start
        self._check = check

    async def start_run(self, schedule: Schedule, run_id: str, namespace: str) -> RunHandle[Any]:
        return await self._start(schedule, run_id, namespace)

    async def check_workflow(self, name: str, namespace: str) -> None:
        await self._check(name, namespace)


def _resumed(state: ScheduleState, schedule: Schedule, now: int) -> ScheduleState:
    """The state of a schedule unpaused at `now`: the windows it was paused in are passed
    over (its floor moves to the window before the current one), its note and held window
    are cleared."""
    new = ScheduleState(**state)
    floor = new.get("last_window")
    fresh = initial_floor(schedule, now)
    new["last_window"] = fresh if not isinstance(floor, int) else max(floor, fresh)
    new["note"] = None
    new["held_window"] = None
    return new


def _epoch_ms(value: datetime | int, what: str) -> int:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError(f"backfill {what}= must be timezone-aware, got {value!r}")
        return round(value.timestamp() * 1000)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"backfill {what}= must be an aware datetime or epoch ms, got {value!r}")
    return value


class ScheduleClient:
    """Create, change, pause, trigger, backfill, describe and delete schedules (module doc).

    Every verb naming an id no schedule has raises `ScheduleNotFoundError`; `create` of an id
    taken (persisted, or static on this engine) raises `ScheduleAlreadyExistsError`. A
    schedule lives in the namespace of the client that created it (`"default"` for a client
    of every namespace) and is fired by the driving engines of that namespace.
    """

    def __init__(
        self,
        store: ScheduleClientStore,
        *,
        starts: ScheduleStarts,
        clock: Callable[[], int],
        namespace: str | None,
        opener: Callable[[], Awaitable[None]],
        static: Sequence[Schedule] = (),
    ):
        self._store = store
        self._starts = starts
        self._clock = clock
        self._namespace = namespace
        self._open = opener
        self._static = {s.id: s for s in static}

    @property
    def declared(self) -> builtins.list[Schedule]:
        """The schedules declared in code on this engine (`Engine(schedules=...)`); empty on
        a `Client`."""
        return builtins.list(self._static.values())

    # ------------------------------------------------------------------ writing

    async def create(self, schedule: Schedule) -> ScheduleDescription:
        """Store a new schedule; it fires from the current window on (windows before its
        creation are never started, whatever its `max_catchup`)."""
        self._check_new(schedule)
        await self._open()
        await self._starts.check_workflow(schedule.workflow_name, self._home)
        now = self._clock()
        state = ScheduleState(last_window=initial_floor(schedule, now), fired_count=0)
        record = self._record(schedule, now=now, created_at=now, state=state)
        if not await self._store.put_schedule(record, if_absent=True):
            raise ScheduleAlreadyExistsError(schedule.id)
        return await self._describe_record(record)

    async def upsert(self, schedule: Schedule) -> ScheduleDescription:
        """`create` when the id is free, else replace the stored schedule's options (its
        state — recent runs, counts — is kept)."""
        self._refuse_static(schedule.id, "upsert")
        try:
            return await self.create(schedule)
        except ScheduleAlreadyExistsError:
            # The stored spec is not read: an upsert also repairs a record that cannot be.
            return await self._replace(schedule.id, lambda _: schedule)

    async def update(self, schedule_id: str, **changes: Any) -> ScheduleDescription:
        """Change some options of a stored schedule (any `Schedule` field but `id`); the new
        schedule is checked as a declaration is. A new cadence moves the window boundaries,
        so the window in progress may fire again under them."""
        self._refuse_static(schedule_id, "update")
        unknown = sorted(set(changes) - set(_FIELDS))
        if unknown:
            raise TypeError(
                f"update of schedule {schedule_id!r}: unknown option "
                f"{', '.join(unknown)} (options: {', '.join(_FIELDS)}; the id cannot change)"
            )
        return await self._replace(
            schedule_id,
            lambda record: dataclasses.replace(schedule_from_record(record), **changes),
        )

    async def pause(self, schedule_id: str, note: str | None = None) -> ScheduleDescription:
        """Stop firing it (a run already started goes on); `note` says why."""
        self._refuse_static(schedule_id, "pause")
        if note is not None and not isinstance(note, str):
            raise TypeError(f"pause note must be a string, got {note!r}")

        def paused(record: ScheduleRecord, now: int) -> ScheduleRecord:
            state = ScheduleState(**record.state)
            state["note"] = note
            return dataclasses.replace(record, paused=True, next_fire_at=None, state=state)

        return await self._describe_record(await self._write(schedule_id, paused))

    async def unpause(self, schedule_id: str) -> ScheduleDescription:
        """Fire it again from the current window on: the windows it was paused in are not
        started (use `backfill` for them). Its note is cleared."""
        self._refuse_static(schedule_id, "unpause")

        def resumed(record: ScheduleRecord, now: int) -> ScheduleRecord:
            schedule = dataclasses.replace(schedule_from_record(record), paused=False)
            state = _resumed(record.state, schedule, now)
            due = next_due(schedule, now, state["last_window"], None)
            return dataclasses.replace(record, paused=False, next_fire_at=due, state=state)

        return await self._describe_record(await self._write(schedule_id, resumed))

    async def delete(self, schedule_id: str) -> None:
        """Remove the schedule (the runs it started stay)."""
        self._refuse_static(schedule_id, "delete")
        await self._open()
        record = await self._get(schedule_id)
        if not await self._store.delete_schedule(record.id):
            raise ScheduleNotFoundError(schedule_id)

    # ------------------------------------------------------------------ starting runs

    async def trigger(self, schedule_id: str) -> RunHandle[Any]:
        """Start the schedule's run now, outside its timetable, as `sched:<id>:manual:<now ms>`
        (a paused schedule too)."""
        schedule, record = await self._find(schedule_id)
        run_id = manual_run_id(schedule.id, self._clock())
        handle = await self._starts.start_run(schedule, run_id, self._namespace_of(record))
        if record is not None:
            await self._remember(record.id, [run_id])
        return handle

    async def backfill(
        self, schedule_id: str, start: datetime | int, end: datetime | int
    ) -> builtins.list[str]:
        """Start every window with `start <= window start < end` (aware datetimes or epoch
        ms), oldest first, as `sched:<id>:<window ms>` — the ids the timetable would have
        given them, so a window that already ran is not started twice and a backfill can be
        repeated. Overlap and jitter do not apply. More than 10,000 windows is refused."""
        start_ms = _epoch_ms(start, "start")
        end_ms = _epoch_ms(end, "end")
        if end_ms <= start_ms:
            raise ValueError(f"backfill of {schedule_id!r}: end must be after start")
        schedule, record = await self._find(schedule_id)
        windows: builtins.list[int] = []
        window = schedule.next_window(start_ms - 1)
        while window is not None and window < end_ms:
            if len(windows) == BACKFILL_MAX_WINDOWS:
                raise ValueError(
                    f"backfill of {schedule_id!r}: more than {BACKFILL_MAX_WINDOWS} windows "
                    "between start and end; backfill a shorter span at a time"
                )
            windows.append(window)
            window = schedule.next_window(window)
        namespace = self._namespace_of(record)
        started: builtins.list[str] = []
        for window in windows:
            run_id = window_run_id(schedule.id, window)
            await self._starts.start_run(schedule, run_id, namespace)
            started.append(run_id)
        if record is not None and started:
            await self._remember(record.id, started)
        return started

    # ------------------------------------------------------------------ reading

    async def describe(self, schedule_id: str) -> ScheduleDescription:
        schedule, record = await self._find(schedule_id)
        if record is not None:
            return await self._describe_record(record)
        return await self._describe_static(schedule)

    async def list(
        self, *, workflow: str | None = None, paused: bool | None = None, limit: int = 100
    ) -> builtins.list[ScheduleDescription]:
        """The schedules of this client's namespace (on an engine its static ones first, by
        id), then the persisted ones by when they are next due; at most `limit`."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= _LIST_MAX:
            raise ValueError(f"limit must be a whole number in [0, {_LIST_MAX}], got {limit!r}")
        await self._open()
        out: builtins.list[ScheduleDescription] = []
        for sid in sorted(self._static):
            schedule = self._static[sid]
            if workflow is not None and schedule.workflow_name != workflow:
                continue
            if paused is not None and schedule.paused != paused:
                continue
            if len(out) < limit:
                out.append(await self._describe_static(schedule))
        offset = 0
        while len(out) < limit:
            want = limit - len(out)
            records = await self._store.list_schedules(
                ScheduleQuery(
                    workflow=workflow,
                    namespace=self._namespace,
                    paused=paused,
                    limit=want,
                    offset=offset,
                )
            )
            offset += len(records)
            for record in records:
                if is_static_state(record.id):
                    continue  # the firing state of a static schedule, not a schedule
                try:
                    out.append(await self._describe_record(record))
                except ValueError as exc:
                    # One record that cannot be read (written by hand, or by another
                    # version) must not hide the others; `describe` of it says what is
                    # wrong, and `upsert` or `delete` repair it.
                    log.warning("durably %s", exc)
            if len(records) < want:
                break
        return out

    # ------------------------------------------------------------------ parts

    @property
    def _home(self) -> str:
        return self._namespace or "default"

    def _namespace_of(self, record: ScheduleRecord | None) -> str:
        return self._home if record is None else record.namespace

    def _check_new(self, schedule: Schedule) -> None:
        if not isinstance(schedule, Schedule):
            raise TypeError(f"schedules take a durably.Schedule, got {schedule!r}")
        if schedule.id in self._static:
            raise ScheduleAlreadyExistsError(schedule.id, "declared in code")
        # The longest id its runs get must be a valid run id: refused here, not at a tick.
        validate_run_id(manual_run_id(schedule.id, 10**13), what="schedule run id")
        dumps(schedule.input)  # the input is stored as JSON: SerializationError otherwise

    def _refuse_static(self, schedule_id: str, verb: str) -> None:
        if schedule_id in self._static:
            raise ValueError(
                f'schedule "{schedule_id}" is declared in code (Engine(schedules=...)): '
                f"{verb} applies to persisted schedules; change its declaration instead"
            )

    def _record(
        self,
        schedule: Schedule,
        *,
        now: int,
        created_at: int,
        state: ScheduleState,
        namespace: str | None = None,
    ) -> ScheduleRecord:
        floor = state.get("last_window")
        held = state.get("held_window")
        return ScheduleRecord(
            id=schedule.id,
            workflow=schedule.workflow_name,
            namespace=namespace or self._home,
            paused=schedule.paused,
            next_fire_at=next_due(
                schedule,
                now,
                floor if isinstance(floor, int) else None,
                held if isinstance(held, int) else None,
            ),
            created_at=created_at,
            updated_at=now,
            spec=schedule_spec(schedule),
            state=state,
        )

    async def _get(self, schedule_id: str) -> ScheduleRecord:
        record = await self._store.get_schedule(schedule_id)
        if (
            record is None
            or is_static_state(record.id)
            or (self._namespace is not None and record.namespace != self._namespace)
        ):
            raise ScheduleNotFoundError(schedule_id)
        return record

    async def _find(self, schedule_id: str) -> tuple[Schedule, ScheduleRecord | None]:
        await self._open()
        static = self._static.get(schedule_id)
        if static is not None:
            return static, None
        record = await self._get(schedule_id)
        return schedule_from_record(record), record

    async def _write(
        self, schedule_id: str, change: Callable[[ScheduleRecord, int], ScheduleRecord]
    ) -> ScheduleRecord:
        """Apply `change` to a fresh read and write it compare-and-set, again on a fresh read
        while an engine's tick (or another client) wrote in between."""
        await self._open()
        for _ in range(_WRITE_ATTEMPTS):
            record = await self._get(schedule_id)
            now = self._clock()
            changed = change(record, now)
            changed = dataclasses.replace(changed, updated_at=max(now, record.updated_at + 1))
            if await self._store.put_schedule(changed, expected_updated_at=record.updated_at):
                return changed
        raise RuntimeError(
            f"schedule {schedule_id!r} kept changing under this write "
            f"({_WRITE_ATTEMPTS} attempts); try again"
        )

    async def _replace(
        self, schedule_id: str, build: Callable[[ScheduleRecord], Schedule]
    ) -> ScheduleDescription:
        def replaced(record: ScheduleRecord, now: int) -> ScheduleRecord:
            schedule = build(record)
            if schedule.id != record.id:
                raise ValueError(f"schedule {record.id!r}: the id cannot change")
            self._check_new(schedule)
            state = ScheduleState(**record.state)
            if record.paused and not schedule.paused:
                # Unpaused by this change: from the current window on, as `unpause` does.
                state = _resumed(state, schedule, now)
            return self._record(
                schedule,
                now=now,
                created_at=record.created_at,
                state=state,
                namespace=record.namespace,
            )

        await self._open()
        current = await self._get(schedule_id)
        name = build(current).workflow_name
        if name != current.workflow:
            await self._starts.check_workflow(name, current.namespace)
        return await self._describe_record(await self._write(schedule_id, replaced))

    async def _remember(self, schedule_id: str, run_ids: builtins.list[str]) -> None:
        """Add runs started by hand to the record's recent runs (newest first)."""

        def noted(record: ScheduleRecord, now: int) -> ScheduleRecord:
            state = ScheduleState(**record.state)
            recent = [r for r in state.get("recent_runs") or [] if r not in run_ids]
            state["recent_runs"] = (run_ids[::-1] + recent)[:RECENT_RUNS_KEPT]
            state["last_run_id"] = run_ids[-1]
            state["last_fire_at"] = now
            return dataclasses.replace(record, state=state)

        try:
            await self._write(schedule_id, noted)
        except ScheduleNotFoundError:
            pass  # deleted meanwhile: the runs started all the same

    async def _summaries(
        self, schedule_id: str, run_ids: builtins.list[str]
    ) -> builtins.list[ScheduleRunSummary]:
        out: builtins.list[ScheduleRunSummary] = []
        for run_id in run_ids[:RECENT_RUNS_KEPT]:
            run = await self._store.get_run(run_id)
            if run is not None:
                out.append(
                    ScheduleRunSummary(run_id, run.status, window_of_run(schedule_id, run_id))
                )
        return out

    def _next_fires(self, schedule: Schedule, now: int) -> builtins.list[int]:
        if schedule.paused:
            return []
        fires: builtins.list[int] = []
        at: int | None = now
        while len(fires) < NEXT_FIRES and at is not None:
            at = schedule.next_window(at)
            if at is not None:
                fires.append(at)
        return fires

    async def _describe_record(self, record: ScheduleRecord) -> ScheduleDescription:
        schedule = schedule_from_record(record)
        state = record.state
        recent = [r for r in state.get("recent_runs") or [] if isinstance(r, str)]
        count = state.get("fired_count")
        return ScheduleDescription(
            schedule=schedule,
            source="persisted",
            note=state.get("note"),
            next_fires=self._next_fires(schedule, self._clock()),
            recent_runs=await self._summaries(record.id, recent),
            last_fire_at=state.get("last_fire_at"),
            last_run_id=state.get("last_run_id"),
            fired_count=count if isinstance(count, int) else 0,
            last_error=state.get("last_error"),
            created_at=record.created_at,
            updated_at=record.updated_at,
        )

    async def _describe_static(self, schedule: Schedule) -> ScheduleDescription:
        # A static schedule's firing is remembered by no store: its recent runs are the runs
        # of its latest windows that exist.
        now = self._clock()
        windows: builtins.list[int] = []
        window = schedule.window_start(now)
        while window is not None and window >= 0 and len(windows) < RECENT_RUNS_KEPT:
            windows.append(window)
            window = schedule.previous_window(window)
        recent = await self._summaries(
            schedule.id, [window_run_id(schedule.id, w) for w in windows]
        )
        last = recent[0].run_id if recent else None
        last_run = None if last is None else await self._store.get_run(last)
        return ScheduleDescription(
            schedule=schedule,
            source="static",
            note=None,
            next_fires=self._next_fires(schedule, now),
            recent_runs=recent,
            last_fire_at=(
                None if last_run is None else round(last_run.created_at.timestamp() * 1000)
            ),
            last_run_id=last,
            fired_count=0,
            last_error=None,
            created_at=None,
            updated_at=None,
        )
