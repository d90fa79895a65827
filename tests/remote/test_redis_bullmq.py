"""`BullWorker` completes jobs that finish together in one pipeline: every job is completed
exactly once, and a completion Redis refuses (its lock was lost) fails only that job."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from bullmq import Queue

from durably._transport.redis_bullmq import (
    BullJob,
    BullQueue,
    BullWorker,
    WorkerTiming,
    redis_client,
)
from tests.remote.redis_support import eventually, redis_prefix, redis_url

__all__ = ["redis_prefix", "redis_url"]

pytestmark = pytest.mark.timeout(60)


async def until(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.05)


async def test_jobs_finishing_together_are_completed_once_each(
    redis_url: str, redis_prefix: str
) -> None:
    name = f"{redis_prefix}-batch"
    client = redis_client(redis_url, patient=False)
    queue = BullQueue(name, client)
    gate = asyncio.Event()
    seen: list[str] = []

    async def process(job: BullJob) -> None:
        seen.append(job.id)
        await gate.wait()  # every job in hand finishes at the same moment

    worker = BullWorker(
        name, process, url=redis_url, concurrency=64, timing=WorkerTiming(drain_delay_s=0.2)
    )
    try:
        ids = await asyncio.gather(*(queue.add("job", {"i": i}, {}) for i in range(300)))
        assert len(set(ids)) == 300
        await eventually(lambda: len(seen) >= 64, what="64 jobs in hand")
        gate.set()
        counts: dict[str, int] = {}

        async def all_done() -> bool:
            counts.update(await queue.counts("completed", "active", "waiting", "failed"))
            return counts["completed"] == 300

        await until(all_done, 20, "300 completed jobs")
        assert counts["failed"] == 0 and counts["active"] == 0 and counts["waiting"] == 0
        assert sorted(seen, key=int) == sorted(ids, key=int)  # each processed once
    finally:
        await worker.close(5)
        await client.aclose()


async def test_a_refused_completion_fails_only_its_own_job(
    redis_url: str, redis_prefix: str
) -> None:
    name = f"{redis_prefix}-lost"
    client = redis_client(redis_url, patient=False)
    queue = BullQueue(name, client)
    gate = asyncio.Event()
    in_hand: list[str] = []
    failed: list[tuple[str, str]] = []

    async def process(job: BullJob) -> None:
        in_hand.append(job.id)
        await gate.wait()

    worker = BullWorker(
        name, process, url=redis_url, concurrency=8, timing=WorkerTiming(drain_delay_s=0.2)
    )
    worker.on_failed(lambda job, reason: failed.append((job.id, reason)))
    try:
        ids = [await queue.add("job", {"i": i}, {}) for i in range(8)]
        await eventually(lambda: len(in_hand) == 8, what="8 jobs in hand")
        # Another worker's stall check would do this to a job whose lock lapsed: the lock is
        # gone, so completing it must be refused.
        victim = ids[3]
        assert await client.delete(f"bull:{name}:{victim}:lock") == 1
        gate.set()
        counts: dict[str, int] = {}

        async def settled() -> bool:
            counts.update(await queue.counts("completed", "active", "failed"))
            return counts["completed"] == 7

        await until(settled, 10, "the 7 other jobs completed")
        raw = Queue(name, {"connection": client})
        state = await raw.getJobState(victim)
        assert state != "completed", state
        completed = [j for j in ids if await raw.getJobState(j) == "completed"]
        assert sorted(completed) == sorted(j for j in ids if j != victim)
    finally:
        await worker.close(5)
        await client.aclose()
