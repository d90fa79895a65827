"""Store round trips of one schedule tick: what the timer poll of every driving engine costs.

Fires one schedule of each kind — declared in code (static) and created at run time
(persisted) — with the engine's own firers over a real SQLite file, counting the store calls
each tick makes: in the steady state (the current window already decided), on the tick that
decides a new window, and while "buffer_one" holds a window behind a live run. Prints one
JSON line: for each case, the calls of one tick by store method (`get_schedule`,
`list_schedules`, `put_schedule`, `get_run`, `start`: the run's creation). Usage::

    python benchmarks/schedule_ticks.py

Counts, not timings: they do not depend on the machine.
"""

from __future__ import annotations

import asyncio
import collections
import json
import tempfile
from pathlib import Path
from typing import Any

import durably
from durably._core.models import WorkflowRun
from durably._core.schedules import ScheduleQuery, ScheduleRecord
from durably._engine.client.schedules import ScheduleClient, StartsBy
from durably._engine.worker.persisted_schedules import PersistedScheduleFirer
from durably._engine.worker.schedules import ScheduleFirer, WindowFiring

MIN = 60_000


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class Counting:
    """The schedule calls of a store, counted (the `ScheduleStore` role)."""

    def __init__(self, store: Any, calls: collections.Counter[str]) -> None:
        self._store = store
        self.calls = calls

    async def put_schedule(
        self,
        record: ScheduleRecord,
        *,
        if_absent: bool = False,
        expected_updated_at: int | None = None,
    ) -> bool:
        self.calls["put_schedule"] += 1
        return bool(
            await self._store.put_schedule(
                record, if_absent=if_absent, expected_updated_at=expected_updated_at
            )
        )

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        self.calls["get_schedule"] += 1
        found: ScheduleRecord | None = await self._store.get_schedule(schedule_id)
        return found

    async def delete_schedule(self, schedule_id: str) -> bool:
        self.calls["delete_schedule"] += 1
        return bool(await self._store.delete_schedule(schedule_id))

    async def list_schedules(self, query: ScheduleQuery) -> list[ScheduleRecord]:
        self.calls["list_schedules"] += 1
        found: list[ScheduleRecord] = await self._store.list_schedules(query)
        return found


async def main() -> None:
    @durably.workflow(name="bench_hold")
    async def hold(ctx: durably.WorkflowCtx, data: Any) -> Any:
        return await ctx.wait_for_signal(f"release:{ctx.run_id}")

    calls: collections.Counter[str] = collections.Counter()
    clock = Clock(1_000 * MIN + 5)
    report: dict[str, Any] = {"bench": "schedule_ticks", "store": "sqlite"}
    with tempfile.TemporaryDirectory() as tmp:
        # drive=False: this engine starts runs and never executes them, so the only store
        # calls counted are the ticks' (a run it starts stays pending: live).
        url = f"sqlite:///{Path(tmp) / 'ticks.db'}"
        async with durably.Engine(url, workflows=[hold], clock=clock, drive=False) as engine:
            store = Counting(engine.store, calls)

            async def start(schedule: durably.Schedule, run_id: str, ns: str | None) -> Any:
                calls["start"] += 1
                return await engine.start(schedule.workflow_name, None, run_id=run_id)

            async def get_run(run_id: str) -> WorkflowRun | None:
                calls["get_run"] += 1
                return await engine.store.get_run(run_id)

            firing = WindowFiring(store=store, start=start, get_run=get_run)
            declared = [
                durably.Schedule("s-allow", hold, every="1m"),
                durably.Schedule("s-buffer", hold, every="1m", overlap="buffer_one"),
            ]
            static = {
                s.id: ScheduleFirer([s], firing=firing, store=store, clock=clock, namespace=None)
                for s in declared
            }
            persisted = PersistedScheduleFirer(store, firing=firing, clock=clock, namespace=None)
            client = ScheduleClient(
                engine.store,
                starts=StartsBy(start=engine._start_schedule_run, check=lambda n, ns: _none()),
                clock=clock,
                namespace=None,
                opener=_none,
            )
            await client.create(durably.Schedule("p-allow", hold, every="1m"))

            async def measure(name: str, tick: Any) -> None:
                calls.clear()
                await tick()
                report[name] = dict(sorted(calls.items()))

            await measure("static_first_tick_ever", static["s-allow"].tick)
            await measure("static_steady", static["s-allow"].tick)
            await measure("persisted_window_due", persisted.tick)
            await measure("persisted_steady", persisted.tick)
            clock.now += MIN
            await measure("static_window_due", static["s-allow"].tick)
            await measure("static_steady_2", static["s-allow"].tick)
            await static["s-buffer"].tick()  # starts its window; the run stays live
            clock.now += MIN
            await static["s-allow"].tick()
            await persisted.tick()
            await measure("static_buffer_one_holds_window", static["s-buffer"].tick)
            await measure("static_buffer_one_held_steady", static["s-buffer"].tick)
    print(json.dumps(report))


async def _none(*_: Any) -> None:
    return None


if __name__ == "__main__":
    asyncio.run(main())
