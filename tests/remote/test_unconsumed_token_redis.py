"""A remote step dispatched to a routing token no live worker consumes, over real Redis: the
run's wait names the token and says no worker beats on it — for the engine, for a `Client`
with only the store, and in `durably runs show` — within seconds; once a worker serves the
step the run completes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import durably
from durably import Client, RunWaiting, WorkflowCtx
from durably.transports import RedisTransport
from tests.cli.support import durably as durably_cli
from tests.engine_support import wait_until
from tests.remote import redis_support

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix


async def test_a_step_on_a_token_nobody_consumes_says_so(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"tok-{redis_prefix}"
    step_name = f"{tag}.render"

    @durably.step(step_name)
    async def render(x: int) -> int:
        return x * 10

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(render, x)

    store = f"sqlite:///{tmp_path / 'e.db'}"
    engine = durably.Engine(
        store,
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[wf],
        steps=[],  # serves no step: the step goes to the transport, where nobody takes it
        timer_poll_ms=50,
    )
    expected = RunWaiting(
        on="step",
        name=step_name,
        detail=f"no worker beats on token {step_name!r} (step {step_name!r})",
    )
    async with engine, Client(store) as client:
        handle = await engine.start(wf, 4, run_id=f"{tag}-r")

        async def says_so() -> bool:
            return (await client.waiting_for([handle.run_id])).get(handle.run_id) == expected

        await wait_until(says_so, timeout=10)
        assert (await engine.waiting_for([handle.run_id]))[handle.run_id] == expected
        out = await asyncio.to_thread(
            durably_cli, "runs", "show", handle.run_id, "--store", store, cwd=Path.cwd()
        )
        assert out.returncode == 0, out.stderr
        assert f"no worker beats on token {step_name!r}" in out.stdout, out.stdout

        # A worker that consumes the token: the step runs, the run completes, no wait is left.
        async with durably.Engine(
            "memory",
            transport=RedisTransport(redis_url, prefix=redis_prefix),
            role="worker",
            steps=[render],
        ):
            assert await handle.result(timeout=20) == 40
        assert await client.waiting_for([handle.run_id]) == {}


async def test_a_consumed_token_is_no_wait(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    """The same run with a worker on the token from the start: its step is simply in flight,
    and nothing is reported while it runs."""
    tag = f"tok2-{redis_prefix}"
    release = asyncio.Event()

    @durably.step(f"{tag}.slow")
    async def slow(x: int) -> int:
        await release.wait()
        return x

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(slow, x)

    store = f"sqlite:///{tmp_path / 'e.db'}"
    async with (
        durably.Engine(
            "memory",
            transport=RedisTransport(redis_url, prefix=redis_prefix),
            role="worker",
            steps=[slow],
        ),
        durably.Engine(
            store,
            transport=RedisTransport(redis_url, prefix=redis_prefix),
            workflows=[wf],
            steps=[],
            timer_poll_ms=50,
        ) as engine,
    ):
        handle = await engine.start(wf, 3)

        async def suspended() -> bool:
            run = await engine.get_run(handle.run_id)
            return run is not None and run.status == "suspended"

        await wait_until(suspended, timeout=10)
        assert await engine.waiting_for([handle.run_id]) == {}
        release.set()
        assert await handle.result(timeout=20) == 3
