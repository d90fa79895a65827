"""A remote workflow over real Redis: the published durable-worker 0.26.1 holds the workflow's
body and its steps, a durably engine owns the run.

The engine starts the workflow by name (it is registered nowhere in the engine: served by
convention, found through the worker's liveness keys), issues each turn over Redis, dispatches
the step the worker's body calls, applies the decisions, and — when the body fails with a coded
error — follows the onError route the worker ANNOUNCES in its descriptor to the inline handler
workflow, which settles the run.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import durably
from durably.transports import RedisTransport
from tests.remote import redis_support
from tests.remote.durable_worker_env import durable_worker_python
from tests.remote.redis_support import wait_for_line

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(600)  # the first run builds the SDK's virtualenv

SDK_WORKER = """
import asyncio, sys
from durable_worker import FatalError, Worker, run_redis_worker

url, prefix, tag = sys.argv[1], sys.argv[2], sys.argv[3]
worker = Worker(auto_register=False)


@worker.step(tag + ".charge")
def charge(data):
    if data["amount"] > 100:
        raise FatalError("over the limit", code="declined", details={"amount": data["amount"]})
    return {"charged": data["amount"]}


@worker.workflow(tag + ".order")
def order(ctx, data):
    receipt = ctx.step(tag + ".charge", {"amount": data["amount"]})
    ctx.sleep(10)
    return {"receipt": receipt, "at": ctx.now() > 0}


@order.on_error("declined")
def refund(ctx, failure):
    return {"refunded": failure["input"]["amount"], "code": failure["error"].get("code")}


async def main():
    await run_redis_worker(worker, connection=url, prefix=prefix, concurrency=4)
    print("ready", flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
"""


@contextmanager
def sdk_worker(url: str, prefix: str, tag: str) -> Iterator[None]:
    proc = subprocess.Popen(
        [str(durable_worker_python()), "-c", SDK_WORKER, url, prefix, tag],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_line(proc, "ready", 60)
        yield
    finally:
        proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


async def test_a_workflow_served_by_durable_worker_with_an_announced_on_error_route(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"rw{os.getpid()}"
    engine = durably.Engine(
        f"sqlite:///{tmp_path / 'engine.db'}",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        # The default registry: the workflows decorated in this process, none of which is the
        # worker's; an engine given `workflows=[]` would be a pure step worker instead.
        workflows=None,
        steps=[],
        timer_poll_ms=50,
    )
    with sdk_worker(redis_url, redis_prefix, tag):
        async with engine:
            ok = await engine.start(f"{tag}.order", {"amount": 40}, run_id=f"{tag}-ok")
            assert await ok.result(timeout=60) == {"receipt": {"charged": 40}, "at": True}
            run = await engine.get_run(f"{tag}-ok")
            assert run is not None and run.status == "completed"
            rows = await engine.list_checkpoints(f"{tag}-ok")
            assert next((r.kind, r.name, r.status) for r in rows) == (
                "remote",
                f"{tag}.charge",
                "completed",
            )

            routed = await engine.start(f"{tag}.order", {"amount": 500}, run_id=f"{tag}-no")
            assert await routed.result(timeout=60) == {"refunded": 500, "code": "declined"}
            handoff = [
                (r.name, r.status)
                for r in await engine.list_checkpoints(f"{tag}-no")
                if r.name.startswith("signal:child:")
            ]
            # the handoff row, settled by the handler's completion
            assert handoff == [(f"signal:child:{tag}-no.onError.1", "completed")]
            handler = await engine.get_run(f"{tag}-no.onError.1")
            assert handler is not None and handler.status == "completed"
            assert handler.workflow == f"{tag}.order.onError.refund"
