"""Static schedules across engine restarts (real SQLite files and real PostgreSQL): an hour of
downtime starts exactly the `max_catchup` latest missed windows and the current one, oldest
first, each once; a paused schedule fires nothing from the timer poll, and redeclaring it
unpaused fires the windows `max_catchup` allows."""

from __future__ import annotations

from typing import Any

import durably
from durably import Engine
from tests.engine_support import wait_until
from tests.schedules.schedule_support import (
    FAST,
    MIN,
    Clock,
    Store,
    all_finished,
    exists,
    run_ids,
    sched_store_fixture,  # noqa: F401  (the `sched_store` fixture)
)


@durably.workflow(name="sched_down")
async def down_wf(ctx: durably.WorkflowCtx, data: Any) -> Any:
    return data


def ids(sid: str, minutes: range | list[int]) -> list[str]:
    return [f"sched:{sid}:{m * MIN}" for m in minutes]


async def test_an_hour_down_starts_the_five_latest_missed_windows_oldest_first(
    sched_store: Store,
) -> None:
    clock = Clock(500 * MIN + 30_000)
    sched = [durably.Schedule("cu", down_wf, every="1m", max_catchup=5)]

    def engine(instance: str) -> Engine:
        return Engine(
            sched_store.url,
            workflows=[down_wf],
            schedules=sched,
            clock=clock,
            instance_id=instance,
            **FAST,
        )

    async with engine("before") as eng:
        # its first poll, at open: nothing ran before, so the 5 windows before this one too
        await wait_until(lambda: exists(eng, f"sched:cu:{500 * MIN}"))
        await wait_until(lambda: all_finished(eng, "sched_down"))
        assert await run_ids(eng, "sched_down") == ids("cu", range(495, 501))
    await sched_store.install_insert_log()

    clock.now = 560 * MIN + 30_000  # one hour later: 59 windows missed, 560 is current
    async with engine("after") as eng:
        await wait_until(lambda: exists(eng, f"sched:cu:{560 * MIN}"))
        # the restarted engine's first poll started exactly these, in this order
        assert await sched_store.inserted() == ids("cu", range(555, 561))
        # a second tick in the same window starts nothing more
        assert await eng.fire_schedules() == ids("cu", range(555, 561))
        await wait_until(lambda: all_finished(eng, "sched_down"))
        assert await run_ids(eng, "sched_down") == ids("cu", [*range(495, 501), *range(555, 561)])
    assert await sched_store.inserted() == ids("cu", range(555, 561))

    clock.now = 563 * MIN + 30_000  # down for 3 windows: fewer missed than max_catchup
    async with engine("again") as eng:
        await wait_until(lambda: exists(eng, f"sched:cu:{563 * MIN}"))
        await wait_until(lambda: all_finished(eng, "sched_down"))
        # the windows already started are not started again
        assert await sched_store.inserted() == ids("cu", range(555, 564))
        assert len(await run_ids(eng, "sched_down")) == 6 + 9


async def test_a_paused_schedule_fires_nothing_until_redeclared_unpaused(
    sched_store: Store,
) -> None:
    clock = Clock(300 * MIN + 5)

    def engine(paused: bool) -> Engine:
        schedules = [
            # Declared before the witness: a tick handles schedules in order, so once the
            # witness's window exists, that tick has passed the paused one too.
            durably.Schedule("p", down_wf, every="1m", paused=paused, max_catchup=2),
            durably.Schedule("witness", down_wf, every="1m"),
        ]
        return Engine(
            sched_store.url, workflows=[down_wf], schedules=schedules, clock=clock, **FAST
        )

    async with engine(paused=True) as eng:
        for m in range(300, 306):
            clock.now = m * MIN + 5
            await wait_until(lambda m=m: exists(eng, f"sched:witness:{m * MIN}"))
        assert await eng.fire_schedules() == [f"sched:witness:{305 * MIN}"]
        await wait_until(lambda: all_finished(eng, "sched_down"))
        assert await run_ids(eng, "sched_down") == ids("witness", range(300, 306))
    await sched_store.install_insert_log()

    # A static schedule is unpaused by declaring it again without paused=True. The windows
    # it did not fire while paused count as missed: the latest max_catchup of them start.
    clock.now = 310 * MIN + 5
    async with engine(paused=False) as eng:
        await wait_until(lambda: exists(eng, f"sched:p:{310 * MIN}"))
        inserted = await sched_store.inserted()
        assert [i for i in inserted if i.startswith("sched:p:")] == ids("p", range(308, 311))
        assert await eng.fire_schedules() == [*ids("p", range(308, 311)), *ids("witness", [310])]
        await wait_until(lambda: all_finished(eng, "sched_down"))
