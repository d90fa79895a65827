"""The Redis admission backend beyond the conformance suite: where its keys live, and an engine
whose queues it counts (`Engine(admission=RedisAdmission(...))`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

import durably
from durably import Queue, WorkflowCtx
from durably._transport.redis_admission import RedisAdmission
from durably.transports import RedisTransport
from tests.engine_support import EngineFactory
from tests.remote.redis_support import REDIS_URL, delete_prefix, require_redis

from .test_engine_queues import RESULT_TIMEOUT, SideEffects


@pytest.fixture
async def prefix() -> AsyncIterator[tuple[str, str]]:
    """(Redis URL, a key prefix of this test's own), its keys deleted afterwards."""
    await require_redis()
    base = f"dtest-{uuid.uuid4().hex[:10]}"
    yield REDIS_URL, f"{base}-adm"
    await delete_prefix(REDIS_URL, base)


async def _keys(url: str, prefix: str) -> set[str]:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        return {key async for key in client.scan_iter(match=f"{prefix}:*", count=500)}
    finally:
        await client.aclose()


async def test_keys_live_under_the_prefix(prefix: tuple[str, str]) -> None:
    url, p = prefix
    backend = RedisAdmission(url, prefix=p, owner="A")
    try:
        queue = Queue("api", concurrency=1)
        assert (await backend.acquire(queue, "a:0", key="a")).admitted
        assert not (await backend.acquire(queue, "b:0", key="b")).admitted
        assert await _keys(url, p) == {
            f"{p}:adm:where",
            f"{p}:adm:api:state",
            f"{p}:adm:api:slots",
            f"{p}:adm:api:sexpire",
            f"{p}:adm:api:waiters",
            f"{p}:adm:api:wmeta",
            f"{p}:adm:api:wexpire",
        }
        assert backend.channel == f"{p}:adm:freed"
        assert await backend.release("a:0", "b:0") == 1
        # Nothing left that names a holder: released slots and places in line are gone.
        assert await _keys(url, p) == {f"{p}:adm:api:state"}
    finally:
        await backend.close()


async def test_renew_extends_only_the_owners_slots(prefix: tuple[str, str]) -> None:
    url, p = prefix
    now = [1_700_000_000_000]
    a = RedisAdmission(url, prefix=p, owner="A", clock=lambda: now[0])
    b = RedisAdmission(url, prefix=p, owner="B", clock=lambda: now[0])
    try:
        queue = Queue("ttl", concurrency=1, slot_ttl=1.0)
        assert (await a.acquire(queue, "a:0", key="a")).admitted
        assert await b.renew(["a:0"]) == set()  # not B's slot
        now[0] += 900
        assert await a.renew(["a:0"]) == {"a:0"}
        now[0] += 900
        assert not (await b.acquire(queue, "b:0", key="b")).admitted  # renewed by A
        now[0] += 100
        assert (await b.acquire(queue, "b:0", key="b")).admitted  # lapsed at last
        assert await a.renew(["a:0"]) == set()
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("mode", ["hot", "replay"])
async def test_an_engine_counts_its_queue_on_redis(
    prefix: tuple[str, str], mode: str, tmp_path: Path
) -> None:
    url, p = prefix
    uid = f"r{uuid.uuid4().hex[:8]}"
    log = SideEffects()

    @durably.step(f"{uid}.call")
    async def call(i: int) -> str:
        return await log.run(f"s{i}", 0.02)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[str]:
        return list(await asyncio.gather(*(ctx.step(call, i, queue="api") for i in range(12))))

    engines = EngineFactory("sqlite", mode, tmp_path)
    backend = RedisAdmission(url, prefix=p)
    queues = [Queue("api", concurrency=2, retry=0.05)]
    async with engines(queues=queues, admission=backend) as engine:
        out = await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
    assert out == [f"s{i}" for i in range(12)]
    assert log.peak() == 2  # reached, never passed
    # Every slot was given back (the keys that would hold one are gone).
    assert f"{p}:adm:api:slots" not in await _keys(url, p)


# ------------------------------------------------------------------ admission="redis" / URL


async def test_admission_redis_uses_the_engines_redis_transport(
    prefix: tuple[str, str], tmp_path: Path
) -> None:
    url, p = prefix
    uid = f"r{uuid.uuid4().hex[:8]}"
    log = SideEffects()

    @durably.step(f"{uid}.call")
    async def call(i: int) -> str:
        return await log.run(f"s{i}", 0.02)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[str]:
        return list(await asyncio.gather(*(ctx.step(call, i, queue="api") for i in range(6))))

    transport = RedisTransport(url, prefix=p)
    async with durably.Engine(
        f"sqlite:///{tmp_path / 'e.db'}",
        transport,
        workflows=[wf],
        steps=[call],
        queues=[Queue("api", concurrency=2, retry=0.05)],
        admission="redis",
        timer_poll_ms=50,
    ) as engine:
        backend = engine._worker.flow.backend
        assert isinstance(backend, RedisAdmission) and backend.owner == engine.instance_id
        assert backend.channel == f"{p}:adm:freed"  # the transport's prefix
        out = await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT)
    assert out == [f"s{i}" for i in range(6)]
    assert log.peak() == 2
    assert f"{p}:adm:api:state" in await _keys(url, p)


async def test_admission_given_a_redis_url_counts_on_that_server(tmp_path: Path) -> None:
    await require_redis()
    uid = f"r{uuid.uuid4().hex[:8]}"
    queue = f"{uid}-api"  # under the default prefix "durable": a queue of this test's own

    @durably.step(f"{uid}.call")
    async def call(i: int) -> int:
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[int]:
        return list(await asyncio.gather(*(ctx.step(call, i, queue=queue) for i in range(4))))

    try:
        async with durably.Engine(
            f"sqlite:///{tmp_path / 'e.db'}",
            queues=[Queue(queue, concurrency=1, retry=0.05)],
            admission=REDIS_URL,
        ) as engine:
            backend = engine._worker.flow.backend
            assert isinstance(backend, RedisAdmission) and backend.owner == engine.instance_id
            assert await engine.execute(wf, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == [
                0,
                1,
                2,
                3,
            ]
            [stats] = await backend.stats([Queue(queue, concurrency=1)])
            assert stats.admitted == 4
    finally:
        client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
        try:
            keys = [k async for k in client.scan_iter(match=f"durable:adm:{queue}:*")]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()


def test_admission_redis_without_a_redis_transport_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r'admission="redis".*has none.*redis://'):
        durably.Engine(f"sqlite:///{tmp_path / 'e.db'}", admission="redis")
    with pytest.raises(ValueError, match=r"expected .*redis:// URL"):
        durably.Engine(f"sqlite:///{tmp_path / 'e.db'}", admission="mysql://x")
