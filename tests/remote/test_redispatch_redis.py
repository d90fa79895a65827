"""`redispatch_pending` over real Redis re-sends a remote step whose task was lost.

The orchestrator serves no steps and no worker is up when the step is dispatched, so its
task waits in the broker's queue; the test deletes it there (a broker that lost it). A step
worker then comes up and receives nothing. `redispatch_pending` — from the orchestrating
engine, or from a store-only `Client` on the same store — sends the step again as its next
attempt, the worker receives it and the run completes. Resident and replay turns alike.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bullmq import Queue

import durably
from durably import WorkflowCtx
from durably.transports import RedisTransport
from tests.engine_support import wait_until
from tests.remote import redis_support

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(90)


async def _job_count(url: str, queue: str) -> int:
    q = Queue(queue, {"connection": url})
    try:
        return sum((await q.getJobCounts()).values())
    finally:
        await q.close()


async def _lose_every_task(url: str, queue: str) -> None:
    q = Queue(queue, {"connection": url})
    try:
        for job in await q.getJobs(["wait", "prioritized", "delayed", "paused"]):
            await job.remove()
    finally:
        await q.close()


@pytest.mark.parametrize("caller", ["engine", "client"])
@pytest.mark.parametrize("replay", [False, True], ids=["resident", "replay"])
async def test_redispatch_pending_resends_a_lost_remote_step(
    caller: str, replay: bool, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"rd-{redis_prefix}"
    received: list[int] = []

    @durably.step(f"{tag}.double")
    async def double(x: int) -> int:
        received.append(x)
        return x * 2

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(double, x)

    store = f"sqlite:///{tmp_path / 'e.db'}"
    orchestrator = durably.Engine(
        store,
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[wf],
        steps=[],
        always_replay=replay,
        timer_poll_ms=50,
    )
    worker = durably.Engine(
        "memory",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        role="worker",
        steps=[double],
    )
    queue = f"{redis_prefix}-tasks-{tag}.double"
    async with orchestrator:
        handle = await orchestrator.start(wf, 21, run_id=f"{tag}-r")

        async def dispatched() -> bool:
            return await _job_count(redis_url, queue) == 1

        await wait_until(dispatched, timeout=20)
        await _lose_every_task(redis_url, queue)
        assert await _job_count(redis_url, queue) == 0
        [row] = [c for c in await orchestrator.list_checkpoints(handle.run_id) if c.seq == 0]
        assert (row.kind, row.status, row.attempts) == ("remote", "pending", 1)

        async with worker:
            if caller == "engine":
                answer = await orchestrator.redispatch_pending(handle.run_id)
            else:
                async with durably.Client(store) as client:
                    answer = await client.redispatch_pending(handle.run_id)
            assert answer == {"runId": handle.run_id, "status": answer["status"], "redispatched": 1}
            assert await handle.result(timeout=15) == 42
    assert received == [21]
    [row] = [c for c in await _checkpoints(store, handle.run_id) if c.seq == 0]
    assert (row.status, row.attempts) == ("completed", 2)


async def _checkpoints(store: str, run_id: str) -> list[durably.StepCheckpoint]:
    async with durably.Client(store) as client:
        return await client.list_checkpoints(run_id)
