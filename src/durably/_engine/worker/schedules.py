"""`ScheduleFirer`: starts the runs of an engine's static schedules from its timer poll.

Every tick computes, from the engine's clock, the windows each schedule is due to fire and
starts their runs by their window ids (`sched:<id>:<window start>`). A start is idempotent by
run id, so ticking twice in one window, or several engines ticking together, starts each
window once. What this engine remembers (the run it last started per schedule, a window held
by "buffer_one") is only an optimisation of which ids to look at: the ids decide.

`WindowFiring` is that per-schedule decision — which windows are due, what overlap does with
a live run, jitter's delayed start — over a `FireMemory` the caller keeps: the static firer
keeps one per schedule in this process, the persisted firer (`persisted_schedules.py`) keeps
it in each schedule's stored state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from durably._core.log_context import durably_logger
from durably._core.models import WorkflowRun
from durably._engine.defs.schedules import Schedule, window_run_id

log = durably_logger("durably.schedules")

StartRun = Callable[[Schedule, str, str | None], Awaitable[Any]]
"""`start(schedule, run_id, namespace)`: start the window's run, idempotently by its id, in
`namespace` (None: the engine's own)."""
GetRun = Callable[[str], Awaitable[WorkflowRun | None]]


@dataclass
class FireMemory:
    """What firing one schedule remembers between ticks.

    `last`: the run it last started; `held`: the window "buffer_one" holds until the live run
    ends; `skipped`: the window "skip" decided not to start (skipped for good, not fired late
    when the live run ends inside it); `floor`: windows at or before it are done and never
    looked at again (None: every window `Schedule.windows` names is a candidate).
    """

    last: str | None = None
    held: int | None = None
    skipped: int | None = None
    floor: int | None = None


class WindowFiring:
    """Fires one schedule's due windows at a given instant, by their window run ids."""

    def __init__(self, *, start: StartRun, get_run: GetRun):
        self._start = start
        self._get_run = get_run

    async def fire(
        self,
        schedule: Schedule,
        now: int,
        memory: FireMemory,
        fired: list[str] | None = None,
        *,
        namespace: str | None = None,
    ) -> list[str]:
        """Start every window of `schedule` due at `now` (oldest first); the run ids started
        (or found started), appended to `fired` as they start (so a caller still knows them
        when a later start raises). A window whose jittered start (`Schedule.due_at`) is
        still ahead waits for a later tick: nothing sleeps here. With a `memory.floor`,
        each window handled moves the floor to it. Runs start in `namespace` (None: the
        engine's)."""
        fired = [] if fired is None else fired
        sid = schedule.id
        if schedule.overlap == "buffer_one" and memory.held is not None:
            # Once the live run has ended the held window starts; until then it waits
            # (replaced below by a newer window that is held in its turn).
            if not await self._live_before(schedule, memory.held, memory):
                held, memory.held = memory.held, None
                fired.append(await self._fire(schedule, held, memory, namespace))
        for window in schedule.windows(now):
            if memory.floor is not None and window <= memory.floor:
                continue
            if now < schedule.due_at(window):
                break  # later windows start later still
            run_id = window_run_id(sid, window)
            if run_id not in fired:  # else: the held window, started just above
                await self._window(schedule, window, run_id, memory, fired, namespace)
            if memory.floor is not None:
                memory.floor = window
        return fired

    async def _window(
        self,
        schedule: Schedule,
        window: int,
        run_id: str,
        memory: FireMemory,
        fired: list[str],
        namespace: str | None,
    ) -> None:
        if schedule.overlap != "allow":
            if memory.skipped == window or memory.last == run_id:
                return
            existing = await self._get_run(run_id)
            if existing is not None:
                memory.last = run_id
                return
            if await self._live_before(schedule, window, memory):
                if schedule.overlap == "skip":
                    memory.skipped = window
                else:
                    memory.held = window  # only the latest held window is kept
                return
        fired.append(await self._fire(schedule, window, memory, namespace))

    async def _live_before(self, schedule: Schedule, window: int, memory: FireMemory) -> bool:
        """Whether a run this schedule started before `window` is still live: the run it last
        started, and the previous window's run (started by any engine)."""
        candidates: set[str] = set()
        previous = schedule.previous_window(window)
        if previous is not None:
            candidates.add(window_run_id(schedule.id, previous))
        if memory.last is not None and memory.last != window_run_id(schedule.id, window):
            candidates.add(memory.last)
        for run_id in candidates:
            run = await self._get_run(run_id)
            if run is not None and not run.is_terminal:
                return True
        return False

    async def _fire(
        self, schedule: Schedule, window: int, memory: FireMemory, namespace: str | None
    ) -> str:
        run_id = window_run_id(schedule.id, window)
        await self._start(schedule, run_id, namespace)
        memory.last = run_id
        return run_id


class ScheduleFirer:
    """The static schedules of one engine, fired at each tick of its timer poll."""

    def __init__(
        self,
        schedules: Sequence[Schedule],
        *,
        firing: WindowFiring,
        clock: Callable[[], int],
    ):
        self._schedules = list(schedules)
        self._firing = firing
        self._clock = clock
        self._memory: dict[str, FireMemory] = {s.id: FireMemory() for s in self._schedules}

    @property
    def schedules(self) -> list[Schedule]:
        return list(self._schedules)

    async def tick(self) -> list[str]:
        """Fire every due window; returns the run ids started (or found started) this tick."""
        fired: list[str] = []
        now = self._clock()
        for schedule in self._schedules:
            if schedule.paused:
                continue
            try:
                fired.extend(await self._firing.fire(schedule, now, self._memory[schedule.id]))
            except Exception:
                # One schedule's failure (a start refused, a store hiccup) must not stop the
                # others: this schedule tries again at the next tick.
                log.exception("durably schedule %r failed to fire; retrying next tick", schedule.id)
        return fired
