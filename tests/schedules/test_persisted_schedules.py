"""Persisted schedules (`engine.schedules`, `client.schedules`) on real stores — memory,
SQLite files, PostgreSQL: create and its errors, firing once per window across engines on a
shared test clock, pause/unpause, trigger, backfill, update, jitter, static coexistence."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Engine, RunQuery
from durably._core.schedules import ScheduleRecord, ScheduleSpec
from tests.engine_support import wait_until
from tests.pg_support import fresh_schema, schema_url

from .test_static_schedules import FAST, MIN, Clock, hold, tick

START = 1_000 * MIN


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store_of(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[Callable[[], Any]]:
    """A function giving what each engine of one test is built on: the same memory store,
    the same SQLite file, or the same PostgreSQL schema."""
    if request.param == "memory":
        shared = durably.InMemoryStateStore()
        yield lambda: shared
        return
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'persisted.db'}"
        yield lambda: url
        return
    async with fresh_schema() as schema:
        pg = schema_url(schema)
        yield lambda: pg


def engine_on(store: Any, clock: Clock, **kw: Any) -> Engine:
    return Engine(store, workflows=[tick, hold], clock=clock, **{**FAST, **kw})


async def run_ids(engine: Engine, workflow: str = "sched_tick") -> list[str]:
    return sorted(r.id for r in await engine.store.list_runs(RunQuery(workflow=workflow)))


async def test_create_describe_and_the_errors(store_of: Callable[[], Any]) -> None:
    clock = Clock(START + 7)
    static = durably.Schedule("declared", tick, every="1h")
    async with engine_on(store_of(), clock, schedules=[static]) as engine:
        made = await engine.schedules.create(
            durably.Schedule("rep", tick, {"n": 1}, every="1m", tags=("nightly",))
        )
        assert made.source == "persisted"
        assert made.schedule.every_ms == MIN and made.schedule.input == {"n": 1}
        assert made.next_fires == [START + i * MIN for i in range(1, 6)]
        assert made.created_at == START + 7 and made.fired_count == 0
        with pytest.raises(durably.ScheduleAlreadyExistsError, match='"rep" already exists'):
            await engine.schedules.create(durably.Schedule("rep", tick, every="5m"))
        with pytest.raises(durably.ScheduleAlreadyExistsError, match="declared in code"):
            await engine.schedules.create(durably.Schedule("declared", tick, every="5m"))
        with pytest.raises(durably.WorkflowNotFoundError, match="unknown workflow 'nope'"):
            await engine.schedules.create(durably.Schedule("bad", "nope", every="5m"))
        for verb in ("describe", "pause", "unpause", "trigger", "delete"):
            with pytest.raises(durably.ScheduleNotFoundError, match='no schedule "ghost"'):
                await getattr(engine.schedules, verb)("ghost")
        with pytest.raises(durably.ScheduleNotFoundError):
            await engine.schedules.update("ghost", every="5m")
        for verb in ("pause", "unpause", "delete"):
            with pytest.raises(ValueError, match="declared in code"):
                await getattr(engine.schedules, verb)("declared")
        listed = await engine.schedules.list()
        assert [(d.schedule.id, d.source) for d in listed] == [
            ("declared", "static"),
            ("rep", "persisted"),
        ]
        assert [d.schedule.id for d in await engine.schedules.list(workflow="nope")] == []
        await engine.schedules.delete("rep")
        with pytest.raises(durably.ScheduleNotFoundError):
            await engine.schedules.describe("rep")
        assert await engine.store.get_schedule("bad") is None


async def test_two_engines_fire_each_persisted_window_once(store_of: Callable[[], Any]) -> None:
    clock = Clock(START + 7)
    async with engine_on(store_of(), clock) as a, engine_on(store_of(), clock) as b:
        await a.schedules.create(durably.Schedule("rep", tick, {"n": 1}, every="1m"))
        for i in range(6):
            if i:
                clock.now += MIN
            await a.fire_schedules()
            await b.fire_schedules()
            await b.fire_schedules()
        expected = [f"sched:rep:{START + i * MIN}" for i in range(6)]
        assert await run_ids(a) == expected
        described = await b.schedules.describe("rep")
        assert described.fired_count == 6
        assert described.last_run_id == expected[-1]
        assert [r.run_id for r in described.recent_runs] == expected[::-1]
        assert all(
            r.window_ms == START + i * MIN for i, r in enumerate(described.recent_runs[::-1])
        )
        await wait_until(lambda: _all_completed(a, expected))


async def _all_completed(engine: Engine, ids: list[str]) -> bool:
    runs = [await engine.store.get_run(i) for i in ids]
    return all(r is not None and r.status == "completed" for r in runs)


async def test_pause_unpause_and_trigger(store_of: Callable[[], Any]) -> None:
    clock = Clock(START + 7)
    async with engine_on(store_of(), clock) as engine:
        await engine.schedules.create(durably.Schedule("rep", tick, every="1m"))
        await engine.fire_schedules()
        paused = await engine.schedules.pause("rep", note="maintenance")
        assert paused.schedule.paused and paused.note == "maintenance" and paused.next_fires == []
        clock.now += 3 * MIN
        assert await engine.fire_schedules() == []
        handle = await engine.schedules.trigger("rep")  # a paused schedule too
        assert handle.run_id == f"sched:rep:manual:{START + 3 * MIN + 7}"
        resumed = await engine.schedules.unpause("rep")
        assert not resumed.schedule.paused and resumed.note is None
        assert await engine.fire_schedules() == [f"sched:rep:{START + 3 * MIN}"]
        # The windows it was paused in are not started.
        assert await run_ids(engine) == sorted(
            [f"sched:rep:{START}", f"sched:rep:{START + 3 * MIN}", handle.run_id]
        )
        described = await engine.schedules.describe("rep")
        assert described.recent_runs[0].run_id == f"sched:rep:{START + 3 * MIN}"
        assert described.recent_runs[1].run_id == handle.run_id
        assert described.recent_runs[1].window_ms is None


async def test_backfill_starts_each_window_once(store_of: Callable[[], Any]) -> None:
    clock = Clock(START + 7)
    async with engine_on(store_of(), clock) as engine:
        await engine.schedules.create(durably.Schedule("rep", tick, every="1m", paused=True))
        since = datetime.fromtimestamp((START - 3 * MIN) / 1000, UTC)
        started = await engine.schedules.backfill("rep", since, START)
        assert started == [f"sched:rep:{START - i * MIN}" for i in (3, 2, 1)]
        again = await engine.schedules.backfill("rep", START - 3 * MIN - 1, START + 1)
        assert again == [f"sched:rep:{START - i * MIN}" for i in (3, 2, 1, 0)]
        assert await run_ids(engine) == sorted(again)
        with pytest.raises(ValueError, match="more than 10000 windows"):
            await engine.schedules.backfill("rep", START, START + 10_001 * MIN)
        with pytest.raises(ValueError, match="timezone-aware"):
            await engine.schedules.backfill("rep", datetime(2026, 1, 1), START)
        with pytest.raises(ValueError, match="end must be after start"):
            await engine.schedules.backfill("rep", START, START)


async def test_update_changes_the_cadence(store_of: Callable[[], Any]) -> None:
    clock = Clock(START + 7)
    async with engine_on(store_of(), clock) as engine:
        await engine.schedules.create(durably.Schedule("rep", tick, every="1m"))
        await engine.fire_schedules()
        updated = await engine.schedules.update("rep", every="10m", input={"v": 2})
        assert updated.schedule.every_ms == 10 * MIN
        assert updated.next_fires[0] == START + 10 * MIN
        clock.now += 5 * MIN
        assert await engine.fire_schedules() == []  # no 1-minute windows any more
        clock.now = START + 10 * MIN
        assert await engine.fire_schedules() == [f"sched:rep:{START + 10 * MIN}"]
        run = await engine.store.get_run(f"sched:rep:{START + 10 * MIN}")
        assert run is not None and run.input == {"v": 2}
        with pytest.raises(TypeError, match="unknown option colour"):
            await engine.schedules.update("rep", colour="red")
        with pytest.raises(ValueError, match="every= must be positive"):
            await engine.schedules.update("rep", every=0)
        assert (await engine.schedules.describe("rep")).schedule.every_ms == 10 * MIN


async def test_a_jittered_persisted_window_waits_for_its_delay(
    store_of: Callable[[], Any],
) -> None:
    sched = durably.Schedule("jit", tick, every="1m", jitter="40s")
    window = START
    while sched.start_delay_ms(window) < 2:
        window += MIN
    delay = sched.start_delay_ms(window)
    clock = Clock(window)
    async with engine_on(store_of(), clock) as a, engine_on(store_of(), clock) as b:
        made = await a.schedules.create(sched)
        assert made.schedule.jitter_ms == 40_000
        assert await a.fire_schedules() == []
        clock.now = window + delay - 1
        assert await b.fire_schedules() == []
        clock.now = window + delay
        # Which tick starts it (these, or an engine's own timer poll reading the clock just
        # after the move) is a race: what counts is the one run, once its delay has passed.
        await b.fire_schedules()
        await a.fire_schedules()
        assert await run_ids(a) == [f"sched:jit:{window}"]


async def test_a_client_manages_schedules_an_engine_fires(store_of: Callable[[], Any]) -> None:
    # A client reads the wall clock: the schedule starts with the window it was created in.
    # The engine's clock is a minute ahead, so its current window is surely a later one.
    clock = Clock(int(time.time() * 1000) + MIN)
    window = clock.now - clock.now % MIN
    async with engine_on(store_of(), clock) as engine, durably.Client(store_of()) as client:
        made = await client.schedules.create(durably.Schedule("rep", "sched_tick", every="1m"))
        assert made.source == "persisted"
        await engine.fire_schedules()
        assert await run_ids(engine) == [f"sched:rep:{window}"]
        assert [d.schedule.id for d in await client.schedules.list()] == ["rep"]


async def test_a_failing_start_is_recorded_and_retried(store_of: Callable[[], Any]) -> None:
    clock = Clock(int(time.time() * 1000) + MIN)
    async with durably.Client(store_of()) as client:
        # No worker beats yet: a client accepts any name (workers may start later).
        await client.schedules.create(durably.Schedule("odd", "sched_elsewhere", every="1m"))
        async with engine_on(store_of(), clock) as engine:
            # Now one beats, and it does not serve the name.
            with pytest.raises(durably.WorkflowNotFoundError, match="sched_elsewhere"):
                await client.schedules.create(
                    durably.Schedule("odd2", "sched_elsewhere", every="1m")
                )
            await _fire_alongside(engine, clock)


async def _fire_alongside(engine: Engine, clock: Clock) -> None:
    await engine.schedules.create(durably.Schedule("rep", tick, every="1m"))
    assert await engine.fire_schedules() == [f"sched:rep:{clock.now - clock.now % MIN}"]
    odd = await engine.schedules.describe("odd")
    assert odd.last_error is not None and "sched_elsewhere" in odd.last_error
    record = await engine.store.get_schedule("odd")
    assert record is not None and record.next_fire_at is not None
    assert record.next_fire_at <= clock.now  # still due: the next tick tries again


async def test_a_sync_client_has_the_schedule_verbs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sync.db'}"
    clock = Clock(int(time.time() * 1000) + MIN)
    async with engine_on(url, clock) as engine:

        def request_handler() -> tuple[str, list[str], list[str]]:
            with durably.SyncClient(url) as client:
                made = client.schedules.create(durably.Schedule("rep", "sched_tick", every="1m"))
                client.schedules.pause("rep", note="quiet")
                handle = client.schedules.trigger("rep")
                handle.result(timeout=30)
                filled = client.schedules.backfill("rep", 10 * MIN, 12 * MIN)
                listed = [d.schedule.id for d in client.schedules.list(paused=True)]
                client.schedules.delete("rep")
                with pytest.raises(durably.ScheduleNotFoundError):
                    client.schedules.describe("rep")
                return made.source, listed, filled

        source, listed, filled = await asyncio.to_thread(request_handler)
        assert source == "persisted" and listed == ["rep"]
        assert filled == [f"sched:rep:{10 * MIN}", f"sched:rep:{11 * MIN}"]
        assert await engine.store.get_schedule("rep") is None


async def _live(engine: Engine, run_id: str) -> bool:
    run = await engine.store.get_run(run_id)
    return run is not None and not run.is_terminal and run.status != "pending"


async def _finished(engine: Engine, run_id: str) -> bool:
    run = await engine.store.get_run(run_id)
    return run is not None and run.is_terminal


@pytest.mark.parametrize("overlap", ["skip", "buffer_one"])
async def test_overlap_is_remembered_in_the_record(
    store_of: Callable[[], Any], overlap: Any
) -> None:
    # Two engines take turns: what overlap decided must hold whichever engine ticks next,
    # so it lives in the record's state, not in one engine's memory.
    clock = Clock(200 * MIN + 7)
    async with engine_on(store_of(), clock) as a, engine_on(store_of(), clock) as b:
        await a.schedules.create(durably.Schedule("ov", hold, every="1m", overlap=overlap))
        first, second, third, fourth = (f"sched:ov:{m * MIN}" for m in (200, 201, 202, 203))
        await a.fire_schedules()
        await wait_until(lambda: _live(a, first))
        clock.now += MIN
        await b.fire_schedules()
        clock.now += MIN
        await a.fire_schedules()
        assert await run_ids(a, "sched_hold") == [first]
        await a.signal(f"release:{first}", "done")
        await wait_until(lambda: _finished(a, first))
        await b.fire_schedules()
        await a.fire_schedules()
        if overlap == "skip":
            assert await run_ids(a, "sched_hold") == [first]
            clock.now += MIN
            await b.fire_schedules()
            assert await run_ids(a, "sched_hold") == sorted([first, fourth])
        else:
            # the latest held window starts once the live run ended; the older one never
            assert await run_ids(a, "sched_hold") == sorted([first, third])
        assert second not in await run_ids(a, "sched_hold")


async def test_unpausing_by_update_skips_the_paused_windows(store_of: Callable[[], Any]) -> None:
    clock = Clock(START + 7)
    async with engine_on(store_of(), clock) as engine:
        await engine.schedules.create(
            durably.Schedule("rep", tick, every="1m", max_catchup=5, paused=True)
        )
        clock.now += 3 * MIN
        assert await engine.fire_schedules() == []
        await engine.schedules.update("rep", paused=False)
        assert await engine.fire_schedules() == [f"sched:rep:{START + 3 * MIN}"]


async def test_a_record_that_cannot_be_read_is_reported_and_repaired(
    store_of: Callable[[], Any],
) -> None:
    clock = Clock(START + 7)
    async with engine_on(store_of(), clock) as engine:
        await engine.schedules.create(durably.Schedule("good", tick, every="1m"))
        # A record written by hand (or by another version): a cadence it cannot have.
        await engine.store.put_schedule(
            ScheduleRecord(
                id="broken",
                workflow="sched_tick",
                next_fire_at=START,
                created_at=START,
                updated_at=START,
                spec=ScheduleSpec(every_ms=-5),
            )
        )
        assert await engine.fire_schedules() == [f"sched:good:{START}"]
        broken = await engine.store.get_schedule("broken")
        assert broken is not None and broken.next_fire_at is None
        assert "every= must be positive" in (broken.state.get("last_error") or "")
        with pytest.raises(ValueError, match='stored schedule "broken" cannot be read'):
            await engine.schedules.describe("broken")
        assert [d.schedule.id for d in await engine.schedules.list()] == ["good"]
        repaired = await engine.schedules.upsert(durably.Schedule("broken", tick, every="1m"))
        assert repaired.schedule.every_ms == MIN
        assert sorted(d.schedule.id for d in await engine.schedules.list()) == ["broken", "good"]


def test_a_cron_windows_delay_stays_below_its_next_fire() -> None:
    pytest.importorskip("croniter")
    sched = durably.Schedule("c", tick, cron="* * * * *", jitter="10m")
    delays = [sched.start_delay_ms(w * MIN) for w in range(100)]
    assert all(0 <= d < MIN for d in delays) and len(set(delays)) > 50


async def test_a_static_schedule_is_described_triggered_and_backfilled(
    store_of: Callable[[], Any],
) -> None:
    clock = Clock(START + 7)
    static = durably.Schedule("declared", tick, {"s": 1}, every="1m")
    async with engine_on(store_of(), clock, schedules=[static]) as engine:
        await engine.fire_schedules()
        clock.now += MIN
        await engine.fire_schedules()
        described = await engine.schedules.describe("declared")
        assert described.source == "static" and described.schedule is static
        assert [r.run_id for r in described.recent_runs] == [
            f"sched:declared:{START + MIN}",
            f"sched:declared:{START}",
        ]
        assert described.last_run_id == f"sched:declared:{START + MIN}"
        assert described.next_fires[0] == START + 2 * MIN
        assert described.created_at is None and described.fired_count == 0
        handle = await engine.schedules.trigger("declared")
        assert handle.run_id == f"sched:declared:manual:{START + MIN + 7}"
        assert await engine.schedules.backfill("declared", START - MIN, START + MIN) == [
            f"sched:declared:{START - MIN}",
            f"sched:declared:{START}",
        ]
        with pytest.raises(ValueError, match="declared in code"):
            await engine.schedules.update("declared", every="5m")
        with pytest.raises(ValueError, match="declared in code"):
            await engine.schedules.upsert(durably.Schedule("declared", tick, every="5m"))
