"""Garbled liveness and descriptor keys on a real Redis, written with plain redis commands.

Anyone who can write to the broker can SET a key under `P-worker-heartbeat:<token>:<id>` or
`P-worker-descriptor:<token>:<id>`: a nesting deep enough to exhaust Python's recursion, a
value of megabytes, bytes that are not UTF-8, a key of another type, a name that is not UTF-8.
While real workers beat next to such keys, everything else must be read as usual: a step that
`requires=` a capability still runs on the good worker, `worker_health()` still lists the good
groups, a remote workflow served by convention is still dispatched.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from bullmq import Queue

import durably
from durably import WorkflowCtx
from durably.transports import RedisTransport
from tests.remote import redis_support

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(120)

DEEP = "[" * 200_000
GARBLED: dict[str, bytes | str] = {
    "deep": DEEP,
    "deep-in-an-object": '{"ts": 1, "status": ' + DEEP,
    # Within every size bound, still far too deep for Python's parser.
    "deep-and-small": '{"ts": 1, "status": ' + "[" * 50_000,
    "huge": '{"ts": 1, "pad": "' + "x" * (2 * 1024 * 1024) + '"}',
    "not-utf8": b"\xff\xfe{",
    "nan": '{"ts": 1700000000000, "status": {"inFlight": NaN}}',
}


async def _eventually(probe: Callable[[], Awaitable[bool]], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.05)


async def _garble(url: str, prefix: str, token: str, only: str | None = None) -> None:
    """Every garbled form (or `only` that one), as a liveness key and as a descriptor key on
    `token`; with every form also a key of another type and a key whose name is not UTF-8."""
    client = aioredis.Redis.from_url(url)
    try:
        for name, value in GARBLED.items():
            if only is not None and name != only:
                continue
            for kind in ("heartbeat", "descriptor"):
                await client.set(f"{prefix}-worker-{kind}:{token}:{name}", value, ex=120)
        for kind in ("heartbeat", "descriptor") if only is None else ():
            await client.hset(f"{prefix}-worker-{kind}:{token}:a-hash", "ts", "1")
            await client.expire(f"{prefix}-worker-{kind}:{token}:a-hash", 120)
            await client.set(f"{prefix}-worker-{kind}:{token}:\xff".encode("latin-1"), "1", ex=120)
    finally:
        await client.aclose()


def _step_worker(url: str, prefix: str, step: Any) -> durably.Engine:
    return durably.Engine(
        "memory",
        transport=RedisTransport(url, prefix=prefix),
        workflows=[],
        steps=[step],
        capabilities=["gpu"],
        role="worker",
    )


@pytest.mark.parametrize("only", ["deep-and-small", None], ids=["deep", "every-form"])
async def test_a_step_that_requires_a_capability_runs_on_the_good_worker(
    redis_url: str, redis_prefix: str, tmp_path: Path, only: str | None
) -> None:
    tag = f"gk-{redis_prefix}"

    @durably.step(f"{tag}.render", requires=["gpu"])
    async def render(x: int) -> int:
        return x * 10

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(render, x)

    engine = durably.Engine(
        f"sqlite:///{tmp_path / 'e.db'}",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[wf],
        steps=[],
        timer_poll_ms=50,
    )
    await _garble(redis_url, redis_prefix, f"{tag}.render", only)
    async with _step_worker(redis_url, redis_prefix, render), engine:
        handle = await engine.start(wf, 4, run_id=f"{tag}-r")
        assert await handle.result(timeout=30) == 40


async def test_worker_health_still_lists_the_good_groups(
    redis_url: str, redis_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tag = f"gh-{redis_prefix}"

    @durably.step(f"{tag}.render")
    async def render(x: int) -> int:
        return x

    engine = durably.Engine(
        f"sqlite:///{tmp_path / 'e.db'}",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[],
        steps=[],
        drive=False,
        role="worker",  # an observer: consumes nothing
    )
    await _garble(redis_url, redis_prefix, f"{tag}.render")
    await _garble(redis_url, redis_prefix, f"{tag}.elsewhere")
    caplog.set_level(logging.WARNING)
    async with _step_worker(redis_url, redis_prefix, render), engine:
        good: list[Any] = []

        async def listed() -> bool:
            groups = {g.group: g for g in await engine.worker_health()}
            group = groups.get(f"{tag}.render")
            good[:] = [w for w in (group.live_workers if group else ()) if w.descriptor is not None]
            return bool(good)

        await _eventually(listed)
        (worker,) = good
        assert worker.descriptor is not None and "gpu" in worker.descriptor.capabilities
        assert worker.status is not None  # the good worker's own status is read as usual

        # Asked again: each garbled key was reported once per reader, not once per read. Two
        # engines of this process read the keys (the observer, and the step worker, whose
        # fleet beat copies what it sees on the transport), so at most two lines each.
        def heartbeat_lines() -> list[str]:
            reported = [
                r.getMessage() for r in caplog.records if "deep-and-small" in r.getMessage()
            ]
            return [m for m in reported if f"worker-heartbeat:{tag}.render:" in m]

        before = heartbeat_lines()
        await engine.worker_health()
        await engine.worker_health()
        after = heartbeat_lines()
        assert 1 <= len(before) <= 2, before
        assert after == before


@pytest.mark.parametrize("only", ["deep-and-small", None], ids=["deep", "every-form"])
async def test_a_remote_workflow_served_by_convention_is_still_dispatched(
    redis_url: str, redis_prefix: str, tmp_path: Path, only: str | None
) -> None:
    tag = f"gc-{redis_prefix}"
    token = f"{tag}.order"
    client = aioredis.Redis.from_url(redis_url)
    try:
        # A workflow worker's liveness key on the convention token, as durable-worker writes it.
        beat = json.dumps({"ts": int(time.time() * 1000)})
        await client.set(f"{redis_prefix}-worker-heartbeat:{token}:wf-worker", beat, ex=120)
    finally:
        await client.aclose()
    # And garbage on another token: it must not hide the live token.
    await _garble(redis_url, redis_prefix, f"{tag}.other", only)
    engine = durably.Engine(
        f"sqlite:///{tmp_path / 'e.db'}",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=None,  # the default registry: none of it is `<tag>.order`
        steps=[],
        timer_poll_ms=50,
    )
    queue = Queue(f"{redis_prefix}-tasks-{token}", {"connection": redis_url})
    try:
        async with engine:
            await engine.start(token, {"amount": 1}, run_id=f"{tag}-r")

            async def dispatched() -> bool:
                return sum((await queue.getJobCounts()).values()) > 0

            await _eventually(dispatched)
            (job,) = await queue.getJobs(["waiting"])
            assert job.data["runId"] == f"{tag}-r"
    finally:
        await queue.close()
