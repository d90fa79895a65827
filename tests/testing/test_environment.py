"""`durably.testing.WorkflowEnvironment`: time skipping, the clock, crashes and restarts, on
the in-memory store, a temporary SQLite file and (one test) PostgreSQL by URL."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import durably
from durably import WorkflowCtx
from durably.testing import StoreCrashed, TestClock, WorkflowEnvironment
from tests.engine_support import wait_until
from tests.pg_support import fresh_schema, schema_url

DAY_MS = 86_400_000
HOUR_MS = 3_600_000

attempts: dict[str, int] = {}


@durably.step("testkit.flaky", retries=6, backoff="exponential", backoff_ms="1m")
async def flaky(key: str) -> int:
    """Fails its first five attempts: five retries with exponential back-off."""
    attempts[key] = attempts.get(key, 0) + 1
    if attempts[key] <= 5:
        raise RuntimeError(f"attempt {attempts[key]} fails")
    return attempts[key]


@durably.workflow("testkit.long")
async def long_haul(ctx: WorkflowCtx, key: str) -> dict[str, Any]:
    await ctx.sleep("30d")
    try:
        answer = await ctx.wait_for_signal(f"testkit-answer:{key}", timeout="7d")
    except durably.SignalTimeoutError:
        answer = "timed out"
    return {"answer": answer, "attempts": await ctx.step(flaky, key)}


@durably.workflow("testkit.day-then-signal")
async def day_then_signal(ctx: WorkflowCtx, key: str) -> str:
    await ctx.sleep("1d")
    answer: str = await ctx.wait_for_signal(f"testkit-go:{key}", timeout="1h")
    return answer


side_effects: dict[str, int] = {}


@durably.step("testkit.effect")
async def effect(name: str) -> str:
    side_effects[name] = side_effects.get(name, 0) + 1
    return name


@durably.workflow("testkit.five-steps")
async def five_steps(ctx: WorkflowCtx, key: str) -> list[str]:
    return [await ctx.step(effect, f"{key}:{i}") for i in range(5)]


@durably.workflow("testkit.nap")
async def nap(ctx: WorkflowCtx, _: None) -> str:
    await ctx.sleep("1h")
    return "rested"


async def _long_haul_on(store: str, key: str) -> None:
    async with WorkflowEnvironment(workflows=[long_haul], steps=[flaky], store=store) as env:
        began_ms = env.clock.now()
        began = time.perf_counter()
        out = await env.run(long_haul, key)
        wall = time.perf_counter() - began
        assert out == {"answer": "timed out", "attempts": 6}
        # 30 days asleep, a 7-day timeout, back-offs of 1+2+4+8+16 minutes: all skipped.
        moved = env.clock.now() - began_ms
        assert moved >= 37 * DAY_MS + 31 * 60_000, moved
        assert wall < 1.0, f"{wall:.3f}s of wall time for {moved / DAY_MS:.1f} days"


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_a_month_of_waits_and_back_offs_takes_no_wall_time(store: str) -> None:
    await _long_haul_on(store, f"long-{store}")


async def test_the_same_test_runs_on_postgresql_by_url() -> None:
    async with fresh_schema(create=False) as schema:
        await _long_haul_on(schema_url(schema), "long-pg")


async def test_a_signal_sent_in_real_time_arrives_before_its_timeout_is_skipped() -> None:
    async with WorkflowEnvironment(workflows=[day_then_signal]) as env:
        began = env.clock.now()
        handle = await env.start(day_then_signal, "k1")

        async def waiting() -> bool:
            return bool(await env.store.list_signal_waiters("testkit-go:k1"))

        await wait_until(waiting)
        # The day's sleep was skipped; the wait's own hour is not, while the test may still
        # send the signal: real time passes and the clock stays put.
        assert env.clock.now() - began >= DAY_MS
        await asyncio.sleep(0.2)
        assert env.clock.now() - began < DAY_MS + HOUR_MS
        await env.client.signal("testkit-go:k1", "go")
        assert await env.result(handle) == "go"
        assert DAY_MS <= env.clock.now() - began < DAY_MS + HOUR_MS


async def test_awaiting_the_result_lets_a_signal_timeout_expire() -> None:
    async with WorkflowEnvironment(workflows=[day_then_signal]) as env:
        began = env.clock.now()
        with pytest.raises(durably.RunFailedError, match="timed out"):
            await env.run(day_then_signal, "k2")
        assert env.clock.now() - began == DAY_MS + HOUR_MS  # exactly the two deadlines


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_a_crash_after_the_third_checkpoint_recovers_without_rerunning_steps(
    store: str,
) -> None:
    key = f"crash-{store}"
    async with WorkflowEnvironment(workflows=[five_steps], steps=[effect], store=store) as env:
        env.crash_after(3, kind="checkpoint")
        handle = await env.start(five_steps, key)

        async def crashed() -> bool:
            return env.crashed

        await wait_until(crashed)
        with pytest.raises(StoreCrashed):
            await env.engine.get_run(handle.run_id)  # the dead engine reaches nothing
        landed = await env.store.list_checkpoints(handle.run_id)
        assert [cp.status for cp in landed] == ["completed"] * 3
        await env.restart()
        assert await env.result(handle) == [f"{key}:{i}" for i in range(5)]
        assert {name: side_effects[name] for name in side_effects if name.startswith(key)} == {
            f"{key}:{i}": 1 for i in range(5)
        }


async def test_without_time_skipping_only_the_test_moves_the_clock() -> None:
    async with WorkflowEnvironment(workflows=[nap], time_skipping=False) as env:
        began = env.clock.now()
        handle = await env.start(nap, None)

        async def suspended() -> bool:
            run = await env.store.get_run(handle.run_id)
            return run is not None and run.status == "suspended"

        await wait_until(suspended)
        assert env.clock.now() == began
        env.clock.advance("59m")
        await asyncio.sleep(0.05)
        run = await env.store.get_run(handle.run_id)
        assert run is not None and run.status == "suspended"
        env.clock.advance(60)  # seconds: the hour is up, and the engine polls at once
        assert await env.result(handle, timeout=5) == "rested"
        assert env.clock.now() - began == HOUR_MS


def test_the_clock_moves_forward_only() -> None:
    clock = TestClock(start=1_000)
    assert clock.advance("5m") == 301_000
    from datetime import UTC, datetime, timedelta

    assert clock.advance(timedelta(seconds=1)) == 302_000
    assert clock.set(datetime.fromtimestamp(400, tz=UTC)) == 400_000
    with pytest.raises(ValueError, match="never go"):
        clock.set(1_000)
    with pytest.raises(ValueError, match="never goes backwards"):
        clock.advance(-1)
    with pytest.raises(ValueError, match="naive"):
        clock.set(datetime(2030, 1, 1))


async def test_options_the_environment_sets_itself_are_refused() -> None:
    with pytest.raises(TypeError, match="clock"):
        WorkflowEnvironment(clock=lambda: 0)
    with pytest.raises(ValueError, match="store=''"):
        WorkflowEnvironment(store="")
    async with WorkflowEnvironment() as env:
        with pytest.raises(ValueError, match="whole number"):
            env.crash_after(0)
        with pytest.raises(ValueError, match="crash kind"):
            env.crash_after(1, kind="nonsense")  # type: ignore[arg-type]


async def test_a_sqlite_environment_removes_its_file_at_exit() -> None:
    async with WorkflowEnvironment(workflows=[nap], store="sqlite") as env:
        folder = env._tmp
        assert folder is not None and folder.is_dir()
        assert await env.run(nap, None) == "rested"
    assert not folder.exists()


@durably.workflow("testkit.sleepy-child")
async def sleepy_child(ctx: WorkflowCtx, days: int) -> int:
    await ctx.sleep(days * 86_400)
    return days


@durably.workflow("testkit.parent")
async def parent(ctx: WorkflowCtx, _: None) -> int:
    return await ctx.child(sleepy_child, 10) + await ctx.child(sleepy_child, 5)


async def test_child_runs_timers_are_skipped_too() -> None:
    async with WorkflowEnvironment(workflows=[parent, sleepy_child], store="sqlite") as env:
        began = env.clock.now()
        assert await env.run(parent, None) == 15
        assert env.clock.now() - began == 15 * DAY_MS


async def test_no_jump_passes_a_signal_timeout_while_the_test_may_still_signal() -> None:
    async with WorkflowEnvironment(workflows=[day_then_signal, nap]) as env:
        began = env.clock.now()
        waiting = await env.start(day_then_signal, "k3")

        async def at_the_wait() -> bool:
            return bool(await env.store.list_signal_waiters("testkit-go:k3"))

        await wait_until(at_the_wait)
        deadline = env.clock.now() + HOUR_MS
        napping = await env.start(nap, None)  # its hour ends with the signal's: after it

        async def napping_suspended() -> bool:
            run = await env.store.get_run(napping.run_id)
            return run is not None and run.status == "suspended"

        await wait_until(napping_suspended)
        await asyncio.sleep(0.1)
        assert env.clock.now() < deadline  # the nap's later deadline waits for the signal's
        assert await env.result(napping) == "rested"  # awaiting: both deadlines expire
        with pytest.raises(durably.RunFailedError, match="timed out"):
            await env.result(waiting)
        assert env.clock.now() - began >= DAY_MS + HOUR_MS


@durably.workflow("testkit.tick")
async def tick(ctx: WorkflowCtx, _: None) -> str:
    return "tick"


async def test_schedule_windows_are_deadlines() -> None:
    hourly = durably.Schedule("testkit-hourly", tick, every="1h")
    async with WorkflowEnvironment(workflows=[tick], schedules=[hourly], start=HOUR_MS) as env:

        async def three_windows() -> bool:
            done = await env.engine.list_runs(workflow="testkit.tick", status="completed")
            return len(done) >= 3

        await wait_until(three_windows)
        windows = sorted(
            int(run.id.rsplit(":", 1)[1])
            for run in await env.engine.list_runs(workflow="testkit.tick")
        )
        assert windows[:3] == [HOUR_MS, 2 * HOUR_MS, 3 * HOUR_MS]


@pytest.mark.parametrize(("kind", "n"), [("run_update", 1), ("write", 6)])
async def test_crashes_after_other_kinds_of_writes_recover_too(kind: str, n: int) -> None:
    key = f"crash-{kind}"
    async with WorkflowEnvironment(workflows=[five_steps], steps=[effect]) as env:
        env.crash_after(n, kind=kind)  # type: ignore[arg-type]
        handle = await env.start(five_steps, key)

        async def crashed() -> bool:
            return env.crashed

        await wait_until(crashed)
        landed = {  # a one-argument step's input is the argument itself
            cp.input
            for cp in await env.store.list_checkpoints(handle.run_id)
            if cp.status == "completed"
        }
        await env.restart()
        assert await env.result(handle) == [f"{key}:{i}" for i in range(5)]
        for i in range(5):
            name = f"{key}:{i}"
            # A step whose checkpoint landed never runs again; one cut off by the crash
            # runs again (its result was never recorded).
            assert side_effects[name] == 1 or (side_effects[name] == 2 and name not in landed)
        assert env.writes("write") > 0  # the new engine's own count


@durably.workflow("testkit.forever", execution_timeout="2d")
async def forever(ctx: WorkflowCtx, _: None) -> str:
    answer: str = await ctx.wait_for_signal("testkit-never")  # no timeout of its own
    return answer


async def test_an_execution_timeout_is_a_deadline() -> None:
    async with WorkflowEnvironment(workflows=[forever]) as env:
        began = env.clock.now()
        with pytest.raises(durably.RunFailedError):
            await env.run(forever, None)
        assert 2 * DAY_MS <= env.clock.now() - began < 2 * DAY_MS + 60_000
