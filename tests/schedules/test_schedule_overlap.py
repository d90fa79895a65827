"""`overlap="skip"` and `"buffer_one"` over several windows, with two engines ticking the same
schedule (real SQLite files and real PostgreSQL): nothing starts while the earlier run is live;
`skip` never starts the windows it passed over, `buffer_one` starts exactly one run, of the
latest window, once the live one has ended."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

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
    finished,
    live,
    run_ids,
    sched_store_fixture,  # noqa: F401  (the `sched_store` fixture)
)


@durably.workflow(name="sched_ov_hold")
async def hold(ctx: durably.WorkflowCtx, data: Any) -> Any:
    # Stays live until released, so later windows see an overlapping run.
    return await ctx.wait_for_signal(f"release:{ctx.run_id}")


def window(m: int) -> str:
    return f"sched:ov:{m * MIN}"


def engines(store: Store, clock: Clock, overlap: Any) -> tuple[Engine, Engine]:
    sched = [durably.Schedule("ov", hold, every="1m", overlap=overlap)]
    a, b = (
        Engine(store.url, workflows=[hold], schedules=sched, clock=clock, instance_id=name, **FAST)
        for name in ("a", "b")
    )
    return a, b


async def release(eng: Engine, run_id: str) -> None:
    await eng.signal(f"release:{run_id}", "done")
    await wait_until(lambda: finished(eng, run_id))


@pytest.mark.parametrize("overlap", ["skip", "buffer_one"])
async def test_nothing_starts_while_live_then_skip_or_exactly_one(
    sched_store: Store, overlap: Any
) -> None:
    # Both engines' timer polls fire too (same clock): the checks are on what the store holds
    # after each round of explicit ticks, whichever tick started a run.
    clock = Clock(200 * MIN + 5)
    a, b = engines(sched_store, clock, overlap)
    async with a, b:
        await a.fire_schedules()
        await b.fire_schedules()
        await wait_until(lambda: live(a, window(200)))
        for m in range(201, 206):  # five windows pass while the first run is live
            clock.now = m * MIN + 5
            await b.fire_schedules()
            await a.fire_schedules()
            assert await run_ids(a, "sched_ov_hold") == [window(200)]
        await release(a, window(200))
        await a.fire_schedules()
        await b.fire_schedules()
        if overlap == "skip":
            # the windows passed over stay skipped, the current one too
            assert await run_ids(a, "sched_ov_hold") == [window(200)]
            clock.now = 206 * MIN + 5  # the next window, nothing live: it fires
            await a.fire_schedules()
            await b.fire_schedules()
            assert await run_ids(a, "sched_ov_hold") == [window(200), window(206)]
            await release(a, window(206))
        else:
            # one run, of the latest held window; more ticks in it start nothing more
            await wait_until(lambda: live(a, window(205)))
            await a.fire_schedules()
            await b.fire_schedules()
            assert await run_ids(a, "sched_ov_hold") == [window(200), window(205)]
            # and it is itself an earlier live run for the windows after it
            clock.now = 207 * MIN + 5
            await a.fire_schedules()
            await b.fire_schedules()
            assert not await exists(a, window(207))
            await release(a, window(205))
            await wait_until(lambda: live(a, window(207)))
            assert await run_ids(a, "sched_ov_hold") == [window(m) for m in (200, 205, 207)]
            await release(a, window(207))
        await wait_until(lambda: all_finished(a, "sched_ov_hold"))


# An engine that never saw the live run (restarted, or added while it is live) and ticks two
# or more windows later: the live run is the one the schedule's stored state names, whoever
# started it, so the new engine skips (or holds) its window as the first engine would have.
@pytest.mark.parametrize("overlap", ["skip", "buffer_one"])
async def test_a_restarted_engine_does_not_overlap_a_live_run(
    sched_store: Store, overlap: Any
) -> None:
    clock = Clock(200 * MIN + 5)
    first, _ = engines(sched_store, clock, overlap)
    async with first:
        await first.fire_schedules()
        await wait_until(lambda: live(first, window(200)))
        clock.now = 201 * MIN + 5
        await first.fire_schedules()
        assert await run_ids(first, "sched_ov_hold") == [window(200)]
    clock.now = 202 * MIN + 5  # back two windows later; the run of 200 is still live
    _, restarted = engines(sched_store, clock, overlap)
    async with restarted:
        await restarted.fire_schedules()
        started = await run_ids(restarted, "sched_ov_hold")
        assert started == [window(200)], f"started beside the live run: {started}"
        await release(restarted, window(200))
        if overlap == "buffer_one":
            # the window the restarted engine held starts once the live run has ended
            await wait_until(lambda: live(restarted, window(202)))
            await release(restarted, window(202))
        await restarted.fire_schedules()
        expected = [window(200)] + ([window(202)] if overlap == "buffer_one" else [])
        assert await run_ids(restarted, "sched_ov_hold") == expected
        await wait_until(lambda: all_finished(restarted, "sched_ov_hold"))


# The decision to skip a window is kept in the schedule's stored state: an engine that first
# ticks in that window after the live run has ended (restarted, or added) does not start it.
async def test_a_skipped_window_is_not_started_late_by_another_engine(
    sched_store: Store,
) -> None:
    clock = Clock(200 * MIN + 5)
    a, b = engines(sched_store, clock, "skip")
    async with a:
        await a.fire_schedules()
        await wait_until(lambda: live(a, window(200)))
        clock.now = 201 * MIN + 5
        await a.fire_schedules()  # 201 is skipped: 200 is live
        await release(a, window(200))
        await a.fire_schedules()
        assert await run_ids(a, "sched_ov_hold") == [window(200)]
        async with b:  # joins while the clock is still inside the skipped window
            await b.fire_schedules()
            started = await run_ids(b, "sched_ov_hold")
            assert started == [window(200)], f"skipped window started: {started}"
            clock.now = 202 * MIN + 5  # the next window, nothing live: it fires, once
            await b.fire_schedules()
            await a.fire_schedules()
            assert await run_ids(b, "sched_ov_hold") == [window(200), window(202)]
            await release(b, window(202))
            await wait_until(lambda: all_finished(b, "sched_ov_hold"))


# Catch-up meets overlap: after downtime the oldest missed window starts, and every later one
# is decided against it at once — "skip" never starts them, "buffer_one" holds only the
# latest and starts it once that run has ended; a window decided is never reconsidered.
@pytest.mark.parametrize("overlap", ["skip", "buffer_one"])
async def test_catchup_windows_respect_the_overlap_policy(sched_store: Store, overlap: Any) -> None:
    clock = Clock(100 * MIN + 5)
    sched = [durably.Schedule("ov", hold, every="1m", overlap=overlap, max_catchup=3)]
    async with Engine(
        sched_store.url, workflows=[hold], schedules=sched, clock=clock, **FAST
    ) as eng:
        # the first tick's missed windows: 97 starts, 98-100 find it live
        await eng.fire_schedules()
        at_once: list[list[str]] = []
        for _ in range(4):  # release whatever is live, tick again, a few times
            await eng.fire_schedules()
            runs = await run_ids(eng, "sched_ov_hold")
            live_now = [r for r in runs if not await finished(eng, r)]
            at_once.append(live_now)
            for run_id in live_now:
                await wait_until(lambda r=run_id: live(eng, r))
                await release(eng, run_id)
        started = await run_ids(eng, "sched_ov_hold")
        await wait_until(lambda: all_finished(eng, "sched_ov_hold"))
    assert all(len(now) <= 1 for now in at_once), f"overlapping runs: {at_once}"
    expected = [window(m) for m in ([97] if overlap == "skip" else [97, 100])]
    assert started == expected, f"started {started}, expected {expected}"


async def test_ticks_of_one_engine_take_turns(sched_store: Store) -> None:
    # Explicit ticks at once with the engine's own timer poll (buffer_one): the held window
    # starts once, and nothing starts beside it.
    clock = Clock(200 * MIN + 5)
    a, _ = engines(sched_store, clock, "buffer_one")
    async with a:
        await a.fire_schedules()
        await wait_until(lambda: live(a, window(200)))
        clock.now = 201 * MIN + 5
        await a.fire_schedules()  # 201 is held: 200 is live
        assert await run_ids(a, "sched_ov_hold") == [window(200)]
        await a.signal(f"release:{window(200)}", "done")
        await wait_until(lambda: finished(a, window(200)))
        reports = await asyncio.gather(*(a.fire_schedules() for _ in range(5)))
        assert all(report == [window(201)] for report in reports), reports
        assert await run_ids(a, "sched_ov_hold") == [window(200), window(201)]
        await wait_until(lambda: live(a, window(201)))
        await release(a, window(201))


async def test_the_state_of_a_static_schedule_is_not_a_persisted_schedule(
    sched_store: Store,
) -> None:
    # A static schedule keeps its decisions in the store; a client that does not declare it
    # neither lists nor describes that state as a schedule of its own.
    clock = Clock(200 * MIN + 5)
    a, _ = engines(sched_store, clock, "skip")
    async with a, durably.Client(sched_store.url) as client:
        await a.fire_schedules()
        await wait_until(lambda: live(a, window(200)))
        assert await a.store.get_schedule("static:ov") is not None
        assert [d.schedule.id for d in await a.schedules.list()] == ["ov"]
        assert [d.source for d in await a.schedules.list()] == ["static"]
        assert await client.schedules.list() == []
        with pytest.raises(durably.ScheduleNotFoundError):
            await client.schedules.describe("static:ov")
        # a persisted schedule listed after it is still found, the page filled past it
        await client.schedules.create(durably.Schedule("zz", hold, every="1h", paused=True))
        assert [d.schedule.id for d in await client.schedules.list(limit=1)] == ["zz"]
        await release(a, window(200))
