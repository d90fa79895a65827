"""Flow control across a fleet: three engine processes on one PostgreSQL store share each
queue's slots (`tests/flow/fleet_process.py` is one of them), counted in the store or on
Redis (`RedisAdmission`, a key prefix of its own per test).

Every number asserted comes from the side-effect log the steps write with wall-clock times
(one machine, one clock), never from the engines' own bookkeeping.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Queue
from durably._core.admission import AdmissionBackend
from durably._store.sql import SqlStateStore
from durably._store.sql.admission import PgAdmission
from durably._transport.redis_admission import RedisAdmission
from tests.pg_support import fresh_schema, schema_url
from tests.remote.redis_support import REDIS_URL, delete_prefix, require_redis
from tests.remote.worker_process import REPO, WorkerProcess, subprocess_env

pytestmark = pytest.mark.timeout(180)

RUNS = 100
STEPS_PER_RUN = 20  # 2,000 steps through a queue of 5
SLOT_TTL_S = 2.0  # fleet_process.QUEUES


@pytest.fixture(params=["store", "redis"])
async def admission(request: pytest.FixtureRequest) -> AsyncIterator[list[str]]:
    """The fleet processes' extra arguments: none (slots counted in the PostgreSQL store), or
    the Redis key prefix of this test (its keys are deleted afterwards)."""
    if request.param == "store":
        yield []
        return
    await require_redis()
    prefix = f"dtest-{uuid.uuid4().hex[:10]}"
    try:
        yield [f"{prefix}-fleet"]
    finally:
        await delete_prefix(REDIS_URL, prefix)


@contextmanager
def fleet(
    url: str, effects: Path, out_dir: Path, namespaces: list[str], extra: list[str]
) -> Iterator[list[WorkerProcess]]:
    procs = [
        WorkerProcess(
            [
                sys.executable,
                "-m",
                "tests.flow.fleet_process",
                url,
                str(effects),
                namespace,
                *extra,
            ],
            out_dir / f"engine-{i}.out",
            cwd=REPO,
            env=subprocess_env(),
        )
        for i, namespace in enumerate(namespaces)
    ]
    try:
        for proc in procs:
            proc.wait_for_output("ready", 60)
        yield procs
    finally:
        for proc in procs:
            proc.stop(grace=10)


def _lines(effects: Path, kind: str) -> list[list[str]]:
    if not effects.exists():
        return []
    return [line.split() for line in effects.read_text().splitlines() if line.startswith(kind)]


def _peak(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = peak = 0
    for _, step in edges:  # at equal times an end (-1) sorts before a start
        running += step
        peak = max(peak, running)
    return peak


async def test_three_engines_never_have_more_than_five_of_2000_steps_in_flight(
    tmp_path: Path, admission: list[str]
) -> None:
    effects = tmp_path / "effects.log"
    async with fresh_schema(create=False) as schema:
        url = schema_url(schema, pool_size=4, max_overflow=4)
        async with durably.Client(url) as client:
            await client.list_runs()  # creates and migrates the schema before the fleet starts
            async with _backend(url, admission) as backend:
                with fleet(url, effects, tmp_path, ["default"] * 3, admission):
                    started = time.monotonic()
                    handles = [
                        await client.start("fleet.batch", STEPS_PER_RUN, run_id=f"batch-{n}")
                        for n in range(RUNS)
                    ]
                    # The backend's own count, sampled while the steps run (fleet-wide).
                    sampled: list[int] = []
                    sampler = asyncio.create_task(_sample(backend, sampled))
                    results = [await h.result(timeout=150) for h in handles]
                    elapsed = time.monotonic() - started
                    sampler.cancel()
                    # A step's slot is given back in the background after its checkpoint
                    # (so a run can end a moment before its last release lands): wait a
                    # little for the count to drain, far less than a slot's TTL.
                    api = await _drained(backend, within=5.0)
    assert results == [STEPS_PER_RUN] * RUNS
    assert len(sampled) > 10 and max(sampled) <= 5, sampled
    assert (api.in_flight, api.waiting, api.admitted) == (0, 0, RUNS * STEPS_PER_RUN)
    spans = _lines(effects, "span")
    labels = [span[1] for span in spans]
    assert len(labels) == RUNS * STEPS_PER_RUN == len(set(labels))  # each step ran once
    assert _peak([(float(s[2]), float(s[3])) for s in spans]) == 5  # reached, never passed
    assert len({span[4] for span in spans}) == 3  # every engine ran some
    # 2,000 steps of 10 ms through 5 slots need 4 s of steps; the rest is admission and
    # checkpoint round trips of three engines on a loaded 2-core machine.
    assert elapsed < 120, elapsed
    print(f"2000 steps, {'redis' if admission else 'store'} admission: {elapsed:.1f} s")


async def test_a_sigkilled_holders_slot_is_free_again_within_its_ttl(
    tmp_path: Path, admission: list[str]
) -> None:
    effects = tmp_path / "effects.log"
    async with fresh_schema(create=False) as schema:
        url = schema_url(schema, pool_size=4, max_overflow=4)
        async with durably.Client(url) as client, durably.Client(url, namespace="victim") as hogs:
            await client.list_runs()
            # The victim drives namespace "victim" only, so it never takes the follower.
            with fleet(url, effects, tmp_path, ["victim", "default"], admission) as (
                victim,
                _survivor,
            ):
                await hogs.start("fleet.hogger", run_id="hog")
                await _wait_for(lambda: _lines(effects, "hog"), 30)
                waiting = await client.start("fleet.follower", run_id="follower")
                await asyncio.sleep(1.5)
                assert not _lines(effects, "next")  # the hog's slot holds it back
                killed_at = time.time()
                victim.sigkill()
                assert await waiting.result(timeout=30) == "next"
    hog = _lines(effects, "hog")
    assert hog and int(hog[0][2]) == victim.pid
    admitted_after = float(_lines(effects, "next")[0][1]) - killed_at
    # The victim renewed its slot at most a third of the TTL before it died; the follower
    # asks again every 200 ms.
    assert 0 < admitted_after < SLOT_TTL_S + 0.2 + 0.5, admitted_after


API = Queue("api", concurrency=5)  # fleet_process.QUEUES, as stats() needs it


@asynccontextmanager
async def _backend(url: str, admission: list[str]) -> AsyncIterator[AdmissionBackend]:
    """An admission backend on the fleet's admission state, to read its counts."""
    backend: AdmissionBackend
    if admission:
        backend = RedisAdmission(REDIS_URL, prefix=admission[0])
        try:
            yield backend
        finally:
            await backend.close()
        return
    store = SqlStateStore.from_url(url)
    try:
        backend = PgAdmission(store, owner="test", clock=lambda: int(time.time() * 1000))
        yield backend
    finally:
        await store.close()


async def _sample(backend: AdmissionBackend, into: list[int]) -> None:
    while True:
        [stats] = await backend.stats([API])
        into.append(stats.in_flight)
        await asyncio.sleep(0.05)


async def _drained(backend: AdmissionBackend, within: float) -> Any:
    """The queue's stats once nothing is in flight, or the last ones read after `within`."""
    deadline = time.monotonic() + within
    while True:
        [stats] = await backend.stats([API])
        if stats.in_flight == 0 or time.monotonic() >= deadline:
            return stats
        await asyncio.sleep(0.05)


async def _wait_for(predicate: Callable[[], object], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)
