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

import pytest

import durably
from durably.transports import RedisTransport
from tests.remote import redis_support
from tests.remote.durable_worker_env import durable_worker_python
from tests.remote.redis_support import wait_for_line
from tests.remote.step_workloads import SDK_STEPS, behaves_as_in_process, worker_app, workflows

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(600)  # the first run builds the SDK's virtualenv

REPO = Path(__file__).resolve().parents[2]
RESULT_TIMEOUT = 30

SDK_WORKER = """
import asyncio, sys
from durable_worker import FatalError, Worker, run_redis_worker

url, prefix, tag = sys.argv[1], sys.argv[2], sys.argv[3]
# STEPS


async def main():
    await run_redis_worker(worker, connection=url, prefix=prefix, concurrency=4)
    print("ready", flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
""".replace("# STEPS\n", SDK_STEPS)


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
    source = worker_app(
        transport_import="from durably._transport.redis import RedisTransport",
        transport="RedisTransport(URL, prefix=PREFIX)",
        url=url,
        prefix=prefix,
        tag=tag,
    )
    module.write_text(textwrap.dedent(source))
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


@pytest.mark.parametrize("server", ["durable-worker", "durably"])
async def test_remote_steps_behave_as_in_process_steps(
    server: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"t{os.getpid()}-{server}"
    wfs = workflows(tag)
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
            await behaves_as_in_process(engine, wfs, tag, server)
