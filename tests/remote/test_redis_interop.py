"""RedisTransport against the published `durable-worker` 0.26.1, unmodified, serving steps with
its own `run_redis_worker` in a subprocess: tasks dispatched by durably reach its handlers, its
results (a value, a FatalError with code and details, a plain exception) reach durably's sink,
its step events and cancellation ride the control channel, and its liveness keys read back."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from durably._core.wire import RemoteTask, sanitize_queue_token, step_id_of
from durably._transport.redis import ControlMessage
from durably.transports import RedisTransport
from tests.remote import redis_support
from tests.remote.durable_worker_env import durable_worker_python
from tests.remote.redis_support import CollectingSink, eventually, wait_for_line

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(600)  # the first run builds the SDK's virtualenv

SDK_WORKER = """
import asyncio, sys
from durable_worker import FatalError, Worker, run_redis_worker

url, prefix = sys.argv[1], sys.argv[2]
worker = Worker(auto_register=False)


@worker.step("py.echo")
async def echo(data, ctx):
    ctx.info("echoing", {"n": data.get("n")})
    return {"echo": data, "context": ctx.context}


@worker.step("py.fatal")
def fatal(data, ctx=None):
    raise FatalError("nope", code="E1", details={"k": 1})


@worker.step("py.boom")
def boom(data):
    raise RuntimeError("kaboom")


@worker.step("py:until-cancelled")
async def until_cancelled(data, ctx):
    for _ in range(400):
        if ctx.cancelled:
            return {"cancelled": True}
        await asyncio.sleep(0.05)
    return {"cancelled": False}


async def main():
    await run_redis_worker(worker, connection=url, prefix=prefix, concurrency=4)
    print("ready", flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
"""


@pytest.fixture
def sdk_python() -> Path:
    try:
        return durable_worker_python()
    except (subprocess.SubprocessError, OSError) as exc:  # no registry, no venv
        if redis_support.services_required():
            raise
        pytest.skip(f"durable-worker 0.26.1 could not be installed: {exc}")


@pytest.fixture
def sdk_worker(
    sdk_python: Path, redis_url: str, redis_prefix: str, tmp_path: Path
) -> Iterator[subprocess.Popen[str]]:
    script = tmp_path / "sdk_worker.py"
    script.write_text(SDK_WORKER)
    proc = subprocess.Popen(
        [str(sdk_python), str(script), redis_url, redis_prefix],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_line(proc, "ready", 60)
        yield proc
    finally:
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def sdk_task(run: str, seq: int, name: str, data: Any, **fields: Any) -> RemoteTask:
    return RemoteTask(
        run_id=run,
        seq=seq,
        name=name,
        step_id=step_id_of(run, seq),
        group=sanitize_queue_token(name),
        input=data,
        attempt=1,
        **fields,
    )


async def test_steps_served_by_durable_worker(
    sdk_worker: subprocess.Popen[str], redis_url: str, redis_prefix: str
) -> None:
    engine = RedisTransport(redis_url, prefix=redis_prefix, instance_id="engine-1")
    sink = CollectingSink()
    progress: list[ControlMessage] = []
    try:
        await engine.start(sink)
        await engine.subscribe_control(progress.append)
        echo = sdk_task("r", 0, "py.echo", {"n": 7}, context={"tenant": "t1"}, priority=3)
        fatal = sdk_task("r", 1, "py.fatal", None)
        boom = sdk_task("r", 2, "py.boom", [1, 2])
        began = int(time.time() * 1000)
        for t in (echo, fatal, boom):
            await engine.dispatch(t)
        got = await sink.wait_for(["r:0", "r:1", "r:2"], timeout=30)

        done = got["r:0"]
        assert done.status == "completed"
        assert done.output == {"echo": {"n": 7}, "context": {"tenant": "t1"}}
        assert done.started_at is not None and done.started_at >= began - 1000
        assert [(e.level, e.message, e.data) for e in done.events] == [
            ("info", "echoing", {"n": 7})
        ]

        failed = got["r:1"]
        assert failed.status == "failed" and failed.error is not None
        assert failed.error.message == "nope"
        assert failed.error.code == "E1"
        assert failed.error.retryable is False
        assert failed.error.details == {"k": 1}

        crashed = got["r:2"]
        assert crashed.status == "failed" and crashed.error is not None
        assert crashed.error.message == "kaboom"
        assert crashed.error.code is None and crashed.error.retryable is None

        # The step event also went out live as a step.progress control message.
        await eventually(lambda: len(progress) >= 1, what="a step.progress message")
        [live] = progress
        assert live.kind == "event" and live.sender == f"py-{socket.gethostname()}-{sdk_worker.pid}"
        assert live.event is not None and live.event["type"] == "step.progress"
        assert live.event["runId"] == "r" and live.event["event"]["message"] == "echoing"
    finally:
        await engine.close()


async def test_cancellation_reaches_a_durable_worker_step(
    sdk_worker: subprocess.Popen[str], redis_url: str, redis_prefix: str
) -> None:
    engine = RedisTransport(redis_url, prefix=redis_prefix, instance_id="engine-1")
    sink = CollectingSink()
    try:
        await engine.start(sink)
        waiting = sdk_task("c", 0, "py:until-cancelled", None)
        assert waiting.group == "py-until-cancelled"
        await engine.dispatch(waiting)
        await asyncio.sleep(0.3)
        await engine.cancel_run("c")
        got = await sink.wait_for(["c:0"], timeout=20)
        assert got["c:0"].output == {"cancelled": True}
    finally:
        await engine.close()


async def test_durable_worker_liveness_keys_read_back(
    sdk_worker: subprocess.Popen[str], redis_url: str, redis_prefix: str
) -> None:
    engine = RedisTransport(redis_url, prefix=redis_prefix)
    instance = f"py-{socket.gethostname()}-{sdk_worker.pid}"
    raw = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        key = f"{redis_prefix}-worker-heartbeat:py.echo:{instance}"
        deadline = time.monotonic() + 10  # the SDK beats from a task it starts in the background
        while not await raw.exists(key):
            assert time.monotonic() < deadline, f"no {key}"
            await asyncio.sleep(0.05)
        assert 0 < await raw.ttl(key) <= 35

        beats = await engine.read_worker_heartbeats("py.echo")
        assert [(b.token, b.instance_id) for b in beats] == [("py.echo", instance)]
        [beat] = beats
        assert abs(beat.last_beat_at - time.time() * 1000) < 60_000
        assert beat.status is not None and beat.status["concurrency"]["limit"] == 4
        assert beat.descriptor_hash is not None and len(beat.descriptor_hash) == 16

        tokens = {"py.echo", "py.fatal", "py.boom", "py-until-cancelled"}
        assert await engine.list_worker_groups() == tokens
        [descriptor] = await engine.read_worker_descriptors()  # one per instance
        assert descriptor["instanceId"] == instance
        assert descriptor["runtime"] == "python"
        steps = ["py.echo", "py.fatal", "py.boom", "py:until-cancelled"]
        assert descriptor["steps"] == sorted(steps)
        assert len(await engine.read_worker_descriptors("py.boom")) == 1

        # Older workers' values, written by hand next to the SDK's: bare numbers, seconds.
        legacy = {
            "sec": "1700000000",
            "ms": "1700000000123",
            "json-sec": json.dumps({"ts": 1700000000}),
            "garbled": "{not json",
        }
        for inst, value in legacy.items():
            await raw.set(f"{redis_prefix}-worker-heartbeat:old:{inst}", value, ex=35)
        old = {b.instance_id: b.last_beat_at for b in await engine.read_worker_heartbeats("old")}
        assert old == {
            "sec": 1_700_000_000_000,
            "ms": 1_700_000_000_123,
            "json-sec": 1_700_000_000_000,
            "garbled": 0,
        }
    finally:
        await raw.aclose()
        await engine.close()
