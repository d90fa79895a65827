"""Cancelling a run reaches the worker running its step: the engine broadcasts `cancel` on the
transport's control channel, and the published durable-worker 0.26.1 step sees
`ctx.cancelled` (a cooperative abort) — here it writes a marker file and returns early."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

import durably
from durably import WorkflowCtx
from durably.transports import RedisTransport
from tests.remote import redis_support
from tests.remote.durable_worker_env import durable_worker_python
from tests.remote.redis_support import wait_for_line

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(600)  # the first run builds the SDK's virtualenv

SDK_WORKER = """
import asyncio, sys
from durable_worker import Worker, run_redis_worker

url, prefix, tag = sys.argv[1], sys.argv[2], sys.argv[3]
worker = Worker(auto_register=False)


@worker.step(tag + ".long")
async def long(data, ctx):
    open(data["started"], "w").close()
    for _ in range(600):
        if ctx.cancelled:
            open(data["marker"], "w").write("cancelled")
            return {"cancelled": True}
        await asyncio.sleep(0.05)
    return {"cancelled": False}


async def main():
    await run_redis_worker(worker, connection=url, prefix=prefix, concurrency=2)
    print("ready", flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
"""


async def file_appears(path: Path, timeout: float = 20) -> None:
    async with asyncio.timeout(timeout):
        while not os.path.exists(path):  # noqa: ASYNC110, ASYNC240 - a local file another process writes
            await asyncio.sleep(0.05)


async def test_cancel_reaches_the_worker_running_the_step(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"cb{os.getpid()}"
    started, marker = tmp_path / "started", tmp_path / "marker"

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, data: dict[str, str]) -> object:
        return await ctx.step(f"{tag}.long", data)

    proc = subprocess.Popen(  # noqa: ASYNC220 - started once, before the engine runs
        [str(durable_worker_python()), "-c", SDK_WORKER, redis_url, redis_prefix, tag],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_line(proc, "ready", 60)
        engine = durably.Engine(
            f"sqlite:///{tmp_path / 'e.db'}",
            transport=RedisTransport(redis_url, prefix=redis_prefix),
            workflows=[wf],
            steps=[],
        )
        async with engine:
            handle = await engine.start(
                wf, {"started": str(started), "marker": str(marker)}, run_id=f"{tag}-r"
            )
            await file_appears(started)
            await engine.cancel(handle.run_id)
            await file_appears(marker)
            run = await engine.get_run(handle.run_id)
            assert run is not None and run.status == "cancelled"
        assert marker.read_text() == "cancelled"
    finally:
        proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
