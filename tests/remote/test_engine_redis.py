"""A durably engine whose steps run on other processes over real Redis.

The workers are the published `durable-worker` 0.26.1 (unmodified, its own `run_redis_worker`
in a subprocess of its own virtualenv) and a `durably worker` process serving the same
workloads. Results, `FatalError` code and details, retries and the onError handoff must behave
as they do with in-process steps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import OnErrorRoute, WorkflowCtx
from durably._transport.redis import RedisTransport
from tests.remote import redis_support
from tests.remote.durable_worker_env import durable_worker_python
from tests.remote.redis_support import wait_for_line

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(600)  # the first run builds the SDK's virtualenv

REPO = Path(__file__).resolve().parents[2]
RESULT_TIMEOUT = 30

SDK_WORKER = """
import asyncio, sys
from durable_worker import FatalError, Worker, run_redis_worker

url, prefix, tag = sys.argv[1], sys.argv[2], sys.argv[3]
worker = Worker(auto_register=False)
attempts = {"n": 0}


@worker.step(tag + ".echo")
async def echo(data, ctx):
    return {"echo": data, "by": "durable-worker"}


@worker.step(tag + ".fatal")
def fatal(data):
    raise FatalError("card declined", code="E1", details={"k": data})


@worker.step(tag + ".flaky")
def flaky(data):
    attempts["n"] += 1
    if attempts["n"] < 3:
        raise RuntimeError("try %d" % attempts["n"])
    return attempts["n"]


async def main():
    await run_redis_worker(worker, connection=url, prefix=prefix, concurrency=4)
    print("ready", flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
"""

DURABLY_WORKER_APP = """
import durably
from durably import FatalError
from durably._transport.redis import RedisTransport

URL, PREFIX, TAG = {url!r}, {prefix!r}, {tag!r}
attempts = {{"n": 0}}


@durably.step(TAG + ".echo")
async def echo(data):
    return {{"echo": data, "by": "durably"}}


@durably.step(TAG + ".fatal")
def fatal(data):
    raise FatalError("card declined", code="E1", details={{"k": data}})


@durably.step(TAG + ".flaky")
def flaky(data):
    attempts["n"] += 1
    if attempts["n"] < 3:
        raise RuntimeError("try %d" % attempts["n"])
    return attempts["n"]


# A step worker for other engines' runs: no workflows of its own, an in-memory store.
app = durably.Engine(
    "memory",
    transport=RedisTransport(URL, prefix=PREFIX),
    workflows=[],
    steps=[echo, fatal, flaky],
)
"""


@contextmanager
def sdk_worker(url: str, prefix: str, tag: str) -> Iterator[None]:
    python = durable_worker_python()
    proc = subprocess.Popen(
        [str(python), "-c", SDK_WORKER, url, prefix, tag],
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


@contextmanager
def durably_worker(url: str, prefix: str, tag: str, tmp_path: Path) -> Iterator[None]:
    module = tmp_path / f"stepapp_{tag.replace('-', '_')}.py"
    module.write_text(textwrap.dedent(DURABLY_WORKER_APP.format(url=url, prefix=prefix, tag=tag)))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO / 'src'}"}
    # The worker's output goes to a file: a pipe nobody reads would fill up and block it.
    log_path = tmp_path / f"{module.stem}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "durably", "worker", "-q", f"{module.stem}:app"],
            cwd=tmp_path,
            stderr=log,
            stdout=log,
            text=True,
            env=env,
        )
    try:
        deadline = time.monotonic() + 30
        while " ready: " not in log_path.read_text():
            assert proc.poll() is None, f"durably worker exited: {log_path.read_text()}"
            assert time.monotonic() < deadline, f"durably worker not ready: {log_path.read_text()}"
            time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _workflows(tag: str) -> dict[str, Any]:
    @durably.workflow(f"{tag}.handler")
    async def handler(ctx: WorkflowCtx, failure: dict[str, Any]) -> dict[str, Any]:
        return {"handled": failure["error"]["code"], "details": failure["error"].get("details")}

    @durably.workflow(f"{tag}.ok")
    async def ok(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{tag}.echo", {"x": x})

    @durably.workflow(f"{tag}.bad")
    async def bad(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{tag}.fatal", x, retries=5)

    @durably.workflow(f"{tag}.retried")
    async def retried(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{tag}.flaky", x, retries=3)

    @durably.workflow(
        f"{tag}.routed", on_error=[OnErrorRoute(code="E1", workflow=f"{tag}.handler")]
    )
    async def routed(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{tag}.fatal", x)

    return {"handler": handler, "ok": ok, "bad": bad, "retried": retried, "routed": routed}


@pytest.mark.parametrize("server", ["durable-worker", "durably"])
async def test_remote_steps_behave_as_in_process_steps(
    server: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"t{os.getpid()}-{server}"
    wfs = _workflows(tag)
    serving = (
        sdk_worker(redis_url, redis_prefix, tag)
        if server == "durable-worker"
        else durably_worker(redis_url, redis_prefix, tag, tmp_path)
    )
    engine = durably.Engine(
        f"sqlite:///{tmp_path / 'engine.db'}",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=list(wfs.values()),
        steps=[],  # an orchestrator: every step runs on the worker
        timer_poll_ms=50,
    )
    with serving:
        async with engine:
            assert await engine.execute(wfs["ok"], 1, timeout=RESULT_TIMEOUT) == {
                "echo": {"x": 1},
                "by": server,
            }
            with pytest.raises(durably.RunFailedError) as info:
                await engine.execute(wfs["bad"], 7, run_id=f"{tag}-bad", timeout=RESULT_TIMEOUT)
            error = info.value.error
            assert error is not None
            assert (error.message, error.code, error.details) == ("card declined", "E1", {"k": 7})
            bad_rows = await engine.list_checkpoints(f"{tag}-bad")
            assert [(r.attempts, r.status) for r in bad_rows] == [(1, "failed")]  # never retried

            assert await engine.execute(wfs["retried"], 0, timeout=RESULT_TIMEOUT) == 3

            routed = await engine.execute(wfs["routed"], 9, run_id=f"{tag}-r", timeout=60)
            assert routed == {"handled": "E1", "details": {"k": 9}}
            run = await engine.get_run(f"{tag}-r")
            assert run is not None and run.status == "completed"
