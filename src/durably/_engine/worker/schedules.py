"""`ScheduleFirer`: starts the runs of an engine's static schedules from its timer poll.

Every tick computes, from the engine's clock, the windows each schedule is due to fire and
starts their runs by their window ids (`sched:<id>:<window start>`). A start is idempotent by
run id, so ticking twice in one window, or several engines ticking together, starts each
window once. What this engine remembers (the run it last started per schedule, a window held
by "buffer_one") is only an optimisation of which ids to look at: the ids decide.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from durably._core.models import WorkflowRun
from durably._engine.defs.schedules import Schedule, window_run_id

log = logging.getLogger("durably")

StartRun = Callable[[Schedule, str], Awaitable[Any]]
GetRun = Callable[[str], Awaitable[WorkflowRun | None]]


class ScheduleFirer:
    def __init__(
        self,
        schedules: Sequence[Schedule],
        *,
        start: StartRun,
        get_run: GetRun,
        clock: Callable[[], int],
    ):
        self._schedules = list(schedules)
        self._start = start
        self._get_run = get_run
        self._clock = clock
        # The run each schedule last started here, and the window "buffer_one" holds.
        self._last: dict[str, str] = {}
        self._held: dict[str, int] = {}
        # Windows "skip" decided not to fire: a window is skipped for good, not fired late
        # when the live run ends inside it.
        self._skipped: dict[str, int] = {}

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
                fired.extend(await self._tick_one(schedule, now))
            except Exception:
                # One schedule's failure (a start refused, a store hiccup) must not stop the
                # others: this schedule tries again at the next tick.
                log.exception("durably schedule %r failed to fire; retrying next tick", schedule.id)
        return fired

    async def _tick_one(self, schedule: Schedule, now: int) -> list[str]:
        fired: list[str] = []
        sid = schedule.id
        if schedule.overlap == "buffer_one" and sid in self._held:
            # Once the live run has ended the held window starts; until then it waits
            # (replaced below by a newer window that is held in its turn).
            if not await self._live_before(schedule, self._held[sid]):
                fired.append(await self._fire(schedule, self._held.pop(sid)))
        for window in schedule.windows(now):
            run_id = window_run_id(sid, window)
            if run_id in fired:
                continue  # the held window, started just above
            if schedule.overlap != "allow":
                if self._skipped.get(sid) == window:
                    continue
                if self._last.get(sid) == run_id:
                    continue
                existing = await self._get_run(run_id)
                if existing is not None:
                    self._last[sid] = run_id
                    continue
                if await self._live_before(schedule, window):
                    if schedule.overlap == "skip":
                        self._skipped[sid] = window
                    else:
                        self._held[sid] = window  # only the latest held window is kept
                    continue
            fired.append(await self._fire(schedule, window))
        return fired

    async def _live_before(self, schedule: Schedule, window: int) -> bool:
        """Whether a run this schedule started before `window` is still live: the run it last
        started here, and the previous window's run (started by any engine)."""
        candidates: set[str] = set()
        previous = schedule.previous_window(window)
        if previous is not None:
            candidates.add(window_run_id(schedule.id, previous))
        last = self._last.get(schedule.id)
        if last is not None and last != window_run_id(schedule.id, window):
            candidates.add(last)
        for run_id in candidates:
            run = await self._get_run(run_id)
            if run is not None and not run.is_terminal:
                return True
        return False

    async def _fire(self, schedule: Schedule, window: int) -> str:
        run_id = window_run_id(schedule.id, window)
        await self._start(schedule, run_id)
        self._last[schedule.id] = run_id
        return run_id
