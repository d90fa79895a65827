"""Worker concurrency (`Engine(concurrency=...)`): how many step handlers one engine runs at
once, fixed or adaptive, and what it reports in `worker_health()`.

The adaptive limit is tested on a `StepLimiter` with a probe the test controls (memory and
CPU readings), ticked by hand; the engine tests use the real probe and check only what holds
on any machine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import AdaptiveConcurrency, Queue, WorkflowCtx
from durably._engine.flow.step_limits import Resources, StepLimiter
from tests.engine_support import EngineFactory

from .test_engine_queues import RESULT_TIMEOUT, SideEffects

# ------------------------------------------------------------------ fixed, in an engine


def _wide(uid: str, log: SideEffects, n: int, seconds: float, queue: str | None = None) -> Any:
    @durably.step(f"{uid}.call")
    async def call(i: int) -> str:
        return await log.run(f"s{i}", seconds)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[str]:
        return list(await asyncio.gather(*(ctx.step(call, i, queue=queue) for i in range(n))))

    return wf


async def test_a_fixed_limit_bounds_the_steps_in_flight(engines: EngineFactory, uid: str) -> None:
    log = SideEffects()
    wf = _wide(uid, log, 12, 0.03)
    async with engines(concurrency=3) as engine:
        out = await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
        [group] = await engine.worker_health()
        [me] = group.live_workers
    assert out == [f"s{i}" for i in range(12)]
    assert log.peak() == 3  # reached, never passed
    assert me.status is not None
    assert me.status.concurrency.to_json() == {"mode": "fixed", "limit": 3}
    assert me.status.in_flight == 0
    assert me.status.throughput_per_min is not None and me.status.throughput_per_min >= 12


async def test_the_lower_of_queue_and_worker_limits_holds(tmp_path: Path, uid: str) -> None:
    engines = EngineFactory("sqlite", "hot", tmp_path)
    for worker, queue in ((2, 5), (5, 2)):
        log = SideEffects()
        wf = _wide(f"{uid}-{worker}", log, 10, 0.03, queue="api")
        queues = [Queue("api", concurrency=queue, retry=0.05)]
        async with engines(concurrency=worker, queues=queues) as engine:
            await engine.execute(wf, run_id=f"{uid}-{worker}-r", timeout=RESULT_TIMEOUT)
            [report] = await engine.queue_stats()
        assert log.peak() == 2, (worker, queue)
        assert (report.in_flight, report.admitted, report.held_here) == (0, 10, 0)


async def test_a_step_waiting_for_a_permit_has_not_started(tmp_path: Path, uid: str) -> None:
    log = SideEffects()
    wf = _wide(uid, log, 2, 0.2)
    durations: list[int] = []
    async with EngineFactory("sqlite", "hot", tmp_path)(concurrency=1) as engine:
        engine.subscribe(
            lambda e: durations.append(e.duration_ms or 0) if e.type == "step.completed" else None
        )
        await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
    assert log.peak() == 1
    # The second step waited 200 ms for the permit; its duration counts from the permit.
    assert len(durations) == 2 and max(durations) < 350, durations


async def test_without_a_limit_the_engine_reports_its_runs(tmp_path: Path) -> None:
    async with EngineFactory("sqlite", "hot", tmp_path)(max_concurrent_runs=7) as engine:
        [group] = await engine.worker_health()
        [me] = group.live_workers
    assert me.status is not None
    assert me.status.concurrency.to_json() == {"mode": "fixed", "limit": 7}


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "fast", "fixed"])
def test_a_bad_concurrency_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(ValueError, match=r"Engine\(concurrency=…\) must be"):
        durably.Engine("memory", concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"EngineOptions\(concurrency=…\) must be"):
        durably.EngineOptions(concurrency=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"min": 0}, "min=…"),
        ({"min": 4, "max": 2}, "below min"),
        ({"start": 40}, "start=40"),
        ({"tick": "1ms"}, "at least 10 ms"),
        ({"ram_ceiling_pct": 120}, "ram_ceiling_pct"),
        ({"ram_admit_pct": 90}, "ram_resume_pct <= ram_admit_pct <= ram_ceiling_pct"),
        ({"latency_tolerance": 1}, "latency_tolerance"),
        ({"decrease": 1.5}, "decrease"),
    ],
)
def test_bad_adaptive_knobs_are_refused_naming_them(knobs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        AdaptiveConcurrency(**knobs)


# ------------------------------------------------------------------ adaptive, by hand


class Probe:
    """Memory and CPU readings the test sets (memory limit 1000 bytes: rss is a percent
    times ten)."""

    def __init__(self) -> None:
        self.rss_pct = 10.0
        self.cpu_pct = 5.0

    def __call__(self) -> Resources:
        return Resources(int(self.rss_pct * 10), 1000, self.cpu_pct)


async def _hold(limiter: StepLimiter, n: int) -> list[asyncio.Task[None]]:
    """`n` steps asking for a permit; returns their tasks once each one has asked."""
    tasks = [asyncio.create_task(limiter.acquire()) for _ in range(n)]
    await asyncio.sleep(0)
    return tasks


def _limiter(**knobs: Any) -> tuple[StepLimiter, Probe]:
    probe = Probe()
    limiter = StepLimiter(AdaptiveConcurrency(tick=3600, **knobs), probe=probe)
    return limiter, probe


async def test_adaptive_starts_at_min_and_grows_while_steps_wait() -> None:
    limiter, _ = _limiter(min=1, max=3)
    try:
        tasks = await _hold(limiter, 5)
        assert (limiter.limit, limiter.in_flight) == (1, 1)
        limiter.tick()
        await asyncio.sleep(0)
        assert (limiter.limit, limiter.in_flight) == (2, 2)
        assert limiter.last_adjust is not None and limiter.last_adjust["reason"] == "grow"
        limiter.tick()
        limiter.tick()  # capped at max
        await asyncio.sleep(0)
        assert (limiter.limit, limiter.in_flight) == (3, 3)
        for _ in range(3):
            limiter.release(10.0)
        await asyncio.sleep(0)
        assert limiter.in_flight == 2  # the last two waiters got theirs
        assert all(t.done() for t in tasks)
        for _ in range(2):
            limiter.release(10.0)
        limiter.tick()  # nobody waited during this tick: no growth
        assert limiter.limit == 3
    finally:
        await limiter.close()


async def test_adaptive_halves_at_the_ram_ceiling_and_brakes_until_memory_resumes() -> None:
    limiter, probe = _limiter(min=1, max=16, start=8)
    try:
        probe.rss_pct = 90  # above the ceiling (85): halve, and no new step starts
        limiter.tick()
        assert (limiter.limit, limiter.braking) == (4, True)
        assert limiter.last_adjust == {
            "at": limiter.last_adjust["at"] if limiter.last_adjust else 0,
            "from": 8,
            "to": 4,
            "reason": "ram_ceiling",
        }
        [blocked] = await _hold(limiter, 1)
        assert not blocked.done() and limiter.in_flight == 0
        probe.rss_pct = 70  # below the admit mark (75) but not the resume mark (65): still braking
        limiter.tick()
        await asyncio.sleep(0)
        assert not blocked.done() and limiter.limit == 4  # no growth while braking
        probe.rss_pct = 60
        limiter.tick()
        await asyncio.sleep(0)
        assert blocked.done() and limiter.in_flight == 1
    finally:
        await limiter.close()


async def test_adaptive_shrinks_on_cpu_and_when_steps_get_slower() -> None:
    limiter, probe = _limiter(min=2, max=32, start=16)
    try:
        probe.cpu_pct = 95
        limiter.tick()
        assert limiter.limit == 12 and limiter.last_adjust is not None
        assert limiter.last_adjust["reason"] == "cpu_ceiling"
        probe.cpu_pct = 5
        for ms in (10.0, 11.0, 9.0):  # a baseline of about 10 ms
            limiter.in_flight += 1
            limiter.release(ms)
        limiter.tick()
        assert limiter.limit == 12
        for ms in (30.0, 31.0, 29.0):  # three times slower than the baseline
            limiter.in_flight += 1
            limiter.release(ms)
        limiter.tick()
        assert limiter.limit == 9 and limiter.last_adjust["reason"] == "shrink"
        for _ in range(20):
            probe.cpu_pct = 99
            limiter.tick()
        assert limiter.limit == 2  # never below min
    finally:
        await limiter.close()


async def test_a_cancelled_waiter_gives_nothing_away() -> None:
    limiter = StepLimiter(1)
    await limiter.acquire()
    [waiting] = await _hold(limiter, 1)
    waiting.cancel()
    await asyncio.sleep(0)
    limiter.release(1.0)
    assert limiter.in_flight == 0
    await asyncio.wait_for(limiter.acquire(), 1)  # the permit is free, not lost to the waiter
    assert limiter.in_flight == 1


# ------------------------------------------------------------------ adaptive, in an engine


async def test_an_adaptive_engine_grows_from_min_and_reports_it(tmp_path: Path, uid: str) -> None:
    log = SideEffects()
    wf = _wide(uid, log, 40, 0.02)
    spec = AdaptiveConcurrency(min=1, max=4, tick=0.05)
    async with EngineFactory("sqlite", "hot", tmp_path)(concurrency=spec) as engine:
        await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
        [group] = await engine.worker_health()
        [me] = group.live_workers
    assert 2 <= log.peak() <= 4  # grew past its start, never past max
    assert me.status is not None
    concurrency = me.status.concurrency.to_json()
    assert (concurrency["mode"], concurrency["min"], concurrency["max"]) == ("adaptive", 1, 4)
    assert 1 <= concurrency["limit"] <= 4
    assert me.status.last_adjust is not None
    assert me.status.rss_bytes is not None and me.status.rss_bytes > 0  # Linux's /proc


def test_adaptive_is_the_default_knobs() -> None:
    engine = durably.Engine("memory", concurrency="adaptive")
    limiter = engine._worker.flow.limiter
    assert limiter is not None and limiter.adaptive == AdaptiveConcurrency()
    assert (limiter.limit, limiter.adaptive.max) == (1, 32)
