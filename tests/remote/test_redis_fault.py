"""A Redis crash while steps are in flight loses no result.

The test runs its OWN redis-server on a free port (the shared one on 6379 is never touched),
with the append-only file synced on every write so a crash keeps every acknowledged write (by
default this machine's Redis keeps nothing on disk). Steps are dispatched, the server is killed
with SIGKILL while handlers run and results are on their way, then started again on the same
files: every result must still reach the sink (at least once; a re-delivered step may answer
twice, which the engine's compare-and-set absorbs)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from durably._core.wire import RemoteTask, StepResult, step_id_of
from durably._transport.redis import WorkerTiming
from durably.transports import RedisTransport
from tests.remote import redis_support
from tests.remote.redis_support import CollectingSink, OwnRedis, eventually

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    redis_support.require_redis_server()
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.stop()


async def test_every_result_survives_a_redis_crash(own_redis: OwnRedis) -> None:
    await redis_support.require_redis()  # the bullmq extra must be there as well
    transport = RedisTransport(
        own_redis.url,
        prefix="fault",
        timing=WorkerTiming(lock_duration_ms=3000, stalled_interval_ms=1000),
    )
    sink = CollectingSink()
    ran: list[str] = []
    rng = random.Random(7)

    async def work(t: RemoteTask) -> StepResult:
        ran.append(t.step_id)
        await asyncio.sleep(rng.uniform(0.05, 0.5))
        return StepResult(
            run_id=t.run_id, seq=t.seq, step_id=t.step_id, status="completed", output=t.seq
        )

    n = 60
    other = RedisTransport(own_redis.url, prefix="fault", instance_id="other")
    cancels: list[str] = []
    try:
        await transport.subscribe_control(lambda m: cancels.append(m.run_id or ""))
        await transport.start(sink)
        server = await transport.step_server(["work"], work, concurrency=6)
        for seq in range(n):
            await transport.dispatch(
                RemoteTask(
                    run_id="f",
                    seq=seq,
                    name="work",
                    step_id=step_id_of("f", seq),
                    group="work",
                    input=None,
                    attempt=1,
                )
            )
        await eventually(lambda: len(sink.by_step()) >= 10, timeout=20, what="10 results")
        before = len(sink.by_step())
        assert before < n, "every step finished before the crash: nothing was in flight"
        own_redis.kill()
        await asyncio.sleep(1.0)
        own_redis.start()
        got = await sink.wait_for([step_id_of("f", seq) for seq in range(n)], timeout=45)
        assert all(got[step_id_of("f", seq)].output == seq for seq in range(n))
        print(
            f"{before} results before the crash; {len(sink.results)} deliveries of {n} steps, "
            f"{len(ran)} handler runs"
        )
        await server.drain(5)
        # The control subscription reconnected and resubscribed on its own.
        await other.cancel_run("after-the-crash")
        await eventually(lambda: "after-the-crash" in cancels, what="a cancel after the crash")
    finally:
        await other.close()
        await transport.close()
