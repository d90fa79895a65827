"""Static `every=` schedules: window ids, exactly-once across engines sharing a store, overlap,
catch-up and pause, all moved by an injected clock (real SQLite files and real PostgreSQL)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Engine, RunQuery
from tests.engine_support import wait_until
from tests.pg_support import fresh_schema, schema_url

FAST: dict[str, Any] = {"timer_poll_ms": 20, "lease_ms": 2000, "drain_timeout_ms": 2000}
MIN = 60_000


@durably.workflow(name="sched_tick")
async def tick(ctx: durably.WorkflowCtx, data: Any) -> Any:
    return data


@durably.workflow(name="sched_hold")
async def hold(ctx: durably.WorkflowCtx, data: Any) -> Any:
    # Stays live until released, so the next window sees an overlapping run.
    return await ctx.wait_for_signal(f"release:{ctx.run_id}")


class Clock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture(params=["sqlite", "postgres"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sched.db'}"
        return
    async with fresh_schema() as schema:
        yield schema_url(schema)


async def _run_ids(engine: Engine, workflow: str) -> list[str]:
    runs = await engine.store.list_runs(RunQuery(workflow=workflow))
    return [r.id for r in runs]


def test_window_ids_and_catchup_windows() -> None:
    s = durably.Schedule("rep", "sched_tick", every="1m", max_catchup=2)
    assert s.window_start(5 * MIN + 123) == 5 * MIN
    assert s.windows(5 * MIN + 123) == [3 * MIN, 4 * MIN, 5 * MIN]
    # never before the epoch
    assert s.windows(MIN + 1) == [0, MIN]
    assert durably.Schedule("x", tick, every=60).windows(7 * MIN) == [7 * MIN]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs exactly one of every= or cron="),
        ({"every": "1m", "cron": "* * * * *"}, "needs exactly one of every= or cron="),
        ({"every": 0}, "every= must be positive"),
        ({"every": "1m", "overlap": "queue"}, "overlap must be one of"),
        ({"every": "1m", "max_catchup": -1}, "max_catchup must be a whole number"),
        ({"every": "1m", "timezone": "Europe/Berlin"}, "timezone= applies to cron="),
        ({"every": "1 fortnight"}, "unknown duration unit"),
    ],
)
def test_bad_schedule_is_a_clear_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        durably.Schedule("s", "sched_tick", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every": "1m", "jitter": 0}, "jitter= must be a positive duration"),
        ({"every": "1m", "jitter": "1m"}, "must be shorter than every="),
    ],
)
def test_bad_jitter_is_a_clear_error(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        durably.Schedule("s", "sched_tick", **kwargs)


def test_jitter_delays_each_window_deterministically_below_the_jitter() -> None:
    s = durably.Schedule("rep", "sched_tick", every="1m", jitter="30s")
    delays = [s.start_delay_ms(w * MIN) for w in range(200)]
    assert all(0 <= d < 30_000 for d in delays)
    assert len(set(delays)) > 150  # spread, not one fixed offset
    # A function of the window's run id alone: another Schedule value (another engine)
    # computes the same delays.
    again = durably.Schedule("rep", tick, {"other": "input"}, every="1m", jitter="30s")
    assert [again.start_delay_ms(w * MIN) for w in range(200)] == delays
    other = durably.Schedule("other", tick, every="1m", jitter="30s")
    assert [other.start_delay_ms(w * MIN) for w in range(200)] != delays  # ids differ
    assert durably.Schedule("rep", tick, every="1m").start_delay_ms(MIN) == 0


async def test_a_jittered_window_starts_at_its_delay_with_its_window_id(tmp_path: Path) -> None:
    sched = durably.Schedule("jit", tick, every="1m", jitter="40s")
    window = 1_000 * MIN
    while sched.start_delay_ms(window) < 2:  # a window whose delay can be stepped across
        window += MIN
    delay = sched.start_delay_ms(window)
    clock = Clock(window)
    async with Engine(
        f"sqlite:///{tmp_path / 'j.db'}", workflows=[tick], schedules=[sched], clock=clock
    ) as engine:
        assert await engine.fire_schedules() == []  # the window began; its start has not
        clock.now = window + delay - 1
        assert await engine.fire_schedules() == []
        assert await _run_ids(engine, "sched_tick") == []
        clock.now = window + delay
        assert await engine.fire_schedules() == [f"sched:jit:{window}"]
        assert await _run_ids(engine, "sched_tick") == [f"sched:jit:{window}"]


def test_engine_refuses_duplicate_ids_and_unknown_workflows() -> None:
    a = durably.Schedule("a", "sched_tick", every="1m")
    with pytest.raises(ValueError, match='duplicate schedule id "a"'):
        Engine("memory", workflows=[tick], schedules=[a, a])
    with pytest.raises(ValueError, match='unknown workflow "nope"'):
        Engine("memory", workflows=[tick], schedules=[durably.Schedule("b", "nope", every=60)])
    with pytest.raises(ValueError, match="without ':'"):
        durably.Schedule("a:b", "sched_tick", every=60)


async def test_two_engines_on_one_store_fire_every_window_once(store_url: str) -> None:
    clock = Clock(1_000 * MIN + 7)
    sched = [durably.Schedule("rep", tick, {"n": 1}, every="1m", tags=("nightly",))]
    make: Callable[[], Engine] = lambda: Engine(  # noqa: E731
        store_url, workflows=[tick], schedules=sched, clock=clock, **FAST
    )
    async with make() as a, make() as b:
        fired: list[str] = []
        for i in range(40):
            # Both engines tick, in alternating order, sometimes twice in a window.
            first, second = (a, b) if i % 2 else (b, a)
            fired += await first.fire_schedules()
            fired += await second.fire_schedules()
            if i % 3:
                clock.now += MIN
            else:
                clock.now += MIN // 3
        ids = await _run_ids(a, "sched_tick")
        starts = sorted(int(i.rsplit(":", 1)[1]) for i in ids)
        expected = list(range(1_000 * MIN, clock.now - clock.now % MIN, MIN))
        # the last window may or may not have been ticked: compare up to the last tick
        assert starts[: len(expected)] == expected  # 0 missing
        assert len(ids) == len(set(ids))  # 0 duplicates (ids are unique run ids)
        assert len(starts) == len(set(starts))
        assert set(fired) == set(ids)
        run = await a.store.get_run(f"sched:rep:{1_000 * MIN}")
        assert run is not None and "nightly" in (run.tags or [])


async def test_the_timer_poll_fires_with_the_engine_clock(store_url: str) -> None:
    clock = Clock(50 * MIN + 5)
    sched = [durably.Schedule("poll", tick, every="1m")]
    async with Engine(store_url, workflows=[tick], schedules=sched, clock=clock, **FAST) as eng:

        async def has(run_id: str) -> bool:
            return await eng.store.get_run(run_id) is not None

        await wait_until(lambda: has(f"sched:poll:{50 * MIN}"))
        clock.now += MIN
        await wait_until(lambda: has(f"sched:poll:{51 * MIN}"))
        assert await eng.store.get_run(f"sched:poll:{52 * MIN}") is None


async def test_a_non_driving_engine_never_fires(tmp_path: Path) -> None:
    clock = Clock(10 * MIN)
    sched = [durably.Schedule("nd", tick, every="1m")]
    url = f"sqlite:///{tmp_path / 'nd.db'}"
    async with Engine(url, workflows=[tick], schedules=sched, clock=clock, drive=False) as eng:
        # a driving engine's poll would fire here; this one has none
        assert await eng.store.get_run(f"sched:nd:{10 * MIN}") is None
        assert await _run_ids(eng, "sched_tick") == []


async def test_catchup_after_downtime_is_bounded(store_url: str) -> None:
    clock = Clock(100 * MIN)
    sched = [durably.Schedule("cu", tick, every="1m", max_catchup=3)]
    async with Engine(store_url, workflows=[tick], schedules=sched, clock=clock, **FAST) as eng:
        first = await eng.fire_schedules()
        assert first == [f"sched:cu:{m * MIN}" for m in (97, 98, 99, 100)]
        clock.now = 110 * MIN + 1  # 9 windows missed: only the latest 3, oldest first, + now
        later = await eng.fire_schedules()
        assert later == [f"sched:cu:{m * MIN}" for m in (107, 108, 109, 110)]
        assert len(await _run_ids(eng, "sched_tick")) == 8


async def test_no_catchup_fires_only_the_current_window(tmp_path: Path) -> None:
    clock = Clock(100 * MIN)
    sched = [durably.Schedule("nc", tick, every="1m")]
    url = f"sqlite:///{tmp_path / 'nc.db'}"
    async with Engine(url, workflows=[tick], schedules=sched, clock=clock, **FAST) as eng:
        assert await eng.fire_schedules() == [f"sched:nc:{100 * MIN}"]
        clock.now = 105 * MIN
        assert await eng.fire_schedules() == [f"sched:nc:{105 * MIN}"]


async def test_paused_fires_nothing(tmp_path: Path) -> None:
    clock = Clock(100 * MIN)
    sched = [durably.Schedule("p", tick, every="1m", paused=True)]
    url = f"sqlite:///{tmp_path / 'p.db'}"
    async with Engine(url, workflows=[tick], schedules=sched, clock=clock, **FAST) as eng:
        assert await eng.fire_schedules() == []
        assert await _run_ids(eng, "sched_hold") + await _run_ids(eng, "sched_tick") == []


async def _live(eng: Engine, run_id: str) -> bool:
    run = await eng.store.get_run(run_id)
    return run is not None and run.status == "suspended"


async def _finished(eng: Engine, run_id: str) -> bool:
    run = await eng.store.get_run(run_id)
    return run is not None and run.is_terminal


async def _exists(eng: Engine, run_id: str) -> bool:
    return await eng.store.get_run(run_id) is not None


@pytest.mark.parametrize("overlap", ["allow", "skip", "buffer_one"])
async def test_overlap(store_url: str, overlap: Any) -> None:
    # The engine's own poll fires too (same clock), so this checks what the store holds
    # after each explicit tick rather than which of the two ticks started a run.
    clock = Clock(200 * MIN)
    sched = [durably.Schedule("ov", hold, every="1m", overlap=overlap)]
    async with Engine(store_url, workflows=[hold], schedules=sched, clock=clock, **FAST) as eng:
        first, second, third, fourth = (f"sched:ov:{m * MIN}" for m in (200, 201, 202, 203))
        await eng.fire_schedules()
        await wait_until(lambda: _live(eng, first))
        clock.now += MIN  # the next window while the first run is still live
        await eng.fire_schedules()
        if overlap == "allow":
            assert await _exists(eng, second)
        else:
            assert not await _exists(eng, second)
            clock.now += MIN  # buffer_one keeps only the latest held window
            await eng.fire_schedules()
            assert not await _exists(eng, third)
        await eng.signal(f"release:{first}", "done")
        await wait_until(lambda: _finished(eng, first))
        await eng.fire_schedules()
        if overlap == "allow":
            assert sorted(await _run_ids(eng, "sched_hold")) == sorted([first, second])
        elif overlap == "skip":
            # the skipped windows stay skipped, not fired late once the run ended
            assert await _run_ids(eng, "sched_hold") == [first]
            clock.now += MIN  # a later window with nothing live fires normally
            await eng.fire_schedules()
            assert sorted(await _run_ids(eng, "sched_hold")) == sorted([first, fourth])
        else:
            # the held (latest) window starts once the live run ended; the older one never
            assert sorted(await _run_ids(eng, "sched_hold")) == sorted([first, third])
