"""Capability routing over real Redis: a step that requires `gpu` goes only to a worker that
declares it. With no such worker live the run is parked `blocked` with the reason; a worker
without the capability does not unblock it; once a worker declaring `gpu` serves the step the
run resumes on its next re-check and completes there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import durably
from durably import WorkflowCtx
from durably.transports import RedisTransport
from tests.remote import redis_support

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix


async def test_a_step_goes_only_to_a_worker_with_its_capabilities(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"cap-{redis_prefix}"
    served_by: list[str] = []

    @durably.step(f"{tag}.render", requires=["gpu"])
    async def render(x: int) -> int:
        served_by.append("gpu-worker")
        return x * 10

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(render, x)

    def worker(capabilities: list[str]) -> durably.Engine:
        # A pure step worker (`role="worker"`) on its own store: it serves `render` only.
        return durably.Engine(
            "memory",
            transport=RedisTransport(redis_url, prefix=redis_prefix),
            role="worker",
            steps=[render],
            capabilities=capabilities,
        )

    engine = durably.Engine(
        f"sqlite:///{tmp_path / 'e.db'}",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[wf],
        steps=[],
        timer_poll_ms=50,
    )
    async with engine:
        handle = await engine.start(wf, 4, run_id=f"{tag}-r")
        run = await handle.wait(timeout=10)
        assert run.status == "blocked"
        assert run.error is not None and "requires gpu" in run.error.message

        async with worker(["cpu"]):
            await asyncio.sleep(6)  # past a re-check: still no worker declares gpu
            run = await engine.get_run(handle.run_id)
            assert run is not None and run.status == "blocked"
            assert run.error is not None and run.error.code == "capability.unavailable"

        async with worker(["gpu", "cuda"]):
            assert await handle.result(timeout=20) == 40
    assert served_by == ["gpu-worker"]
