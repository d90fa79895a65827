"""Redis for the tests: reachability (skip, or fail under CI), one key prefix per test, and a
step-server process to kill.

- `DURABLY_TEST_REDIS_URL` (default `redis://127.0.0.1:6379/0`) names the shared server.
- When it cannot be reached (or `bullmq` is not installed), tests that need it are skipped —
  unless `DURABLY_REQUIRE_SERVICES=1` (set by `.ci/run`), which turns that into a failure.
- `redis_prefix` is a fresh key prefix (`dtest-<hex>`); every key under it (`<prefix>-*`, and
  BullMQ's `bull:<prefix>-*`) is deleted after the test. Tests never flush the shared server.
- `python -m tests.remote.redis_support serve …` runs a `RedisTransport` step server in a
  process of its own (the kill test SIGKILLs it mid-step).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.pg_support import services_required

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_URL = os.environ.get("DURABLY_TEST_REDIS_URL") or DEFAULT_REDIS_URL
REPO = Path(__file__).resolve().parents[2]

_unreachable: str | None = None
_checked = False


def _refuse(message: str) -> None:
    if services_required():
        pytest.fail(f"{message} (DURABLY_REQUIRE_SERVICES=1: services are required)")
    pytest.skip(message)


async def require_redis() -> None:
    """Skip the calling test when Redis or the `redis` extra is missing (fail if services are
    required)."""
    global _unreachable, _checked
    if not _checked:
        _checked = True
        try:
            import bullmq  # noqa: F401
            import redis.asyncio as aioredis
        except ModuleNotFoundError as exc:
            _unreachable = f"the redis extra is not installed ({exc})"
        else:
            client = aioredis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
            try:
                await client.ping()
            except Exception as exc:
                _unreachable = f"{type(exc).__name__}: {exc}"
            finally:
                await client.aclose()
    if _unreachable is not None:
        _refuse(f"Redis at {REDIS_URL} is unreachable: {_unreachable}")


async def delete_prefix(url: str, prefix: str) -> int:
    """Delete every key of `prefix` (plain and BullMQ's), by SCAN; how many."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    deleted = 0
    try:
        for pattern in (f"{prefix}-*", f"bull:{prefix}-*"):
            batch: list[Any] = []
            async for key in client.scan_iter(match=pattern, count=500):
                batch.append(key)
                if len(batch) >= 500:
                    deleted += await client.delete(*batch)
                    batch = []
            if batch:
                deleted += await client.delete(*batch)
    finally:
        await client.aclose()
    return deleted


@pytest.fixture
async def redis_url() -> str:
    await require_redis()
    return REDIS_URL


@pytest.fixture
async def redis_prefix(redis_url: str) -> AsyncIterator[str]:
    prefix = f"dtest-{uuid.uuid4().hex[:10]}"
    yield prefix
    await delete_prefix(redis_url, prefix)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_line(proc: subprocess.Popen[str], wanted: str, timeout: float) -> str:
    """The first stdout line of `proc` starting with `wanted` (fails on exit or timeout)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line.rstrip())
        if line.startswith(wanted):
            return line.rstrip()
    raise AssertionError(f"no {wanted!r} from the subprocess; it printed: {seen}")


@contextmanager
def step_server_process(url: str, prefix: str, token: str, **timing: int) -> Iterator[Any]:
    """A subprocess serving `token` with the `sleepy` handler below; killed on exit."""
    args = [sys.executable, "-m", "tests.remote.redis_support", "serve", url, prefix, token]
    args += [f"--{k.replace('_', '-')}={v}" for k, v in timing.items()]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, text=True, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


class OwnRedis:
    """A throw-away redis-server on a free port, for tests that kill or restart Redis (never
    the shared one). Its append-only file is synced on every write, so a SIGKILL keeps every
    acknowledged write, as a production Redis would."""

    def __init__(self, folder: Path):
        self.port = free_port()
        self.folder = folder
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.folder),
                "--appendonly", "yes",
                "--appendfsync", "always",
                "--save", "",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.exceptions.RedisError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL: what a crash does."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def require_redis_server() -> None:
    """Skip (or fail, when services are required) without a `redis-server` binary."""
    if shutil.which("redis-server") is None:
        _refuse("redis-server is not installed")


# ------------------------------------------------------------------ the subprocess


async def _serve(ns: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO / "src"))
    from durably._core.wire import RemoteTask, StepResult
    from durably._transport.redis import WorkerTiming
    from durably.transports import RedisTransport

    transport = RedisTransport(
        ns.url,
        prefix=ns.prefix,
        instance_id=f"killable-{os.getpid()}",
        timing=WorkerTiming(
            lock_duration_ms=ns.lock_duration_ms,
            stalled_interval_ms=ns.stalled_interval_ms,
        ),
    )

    async def sleepy(task: RemoteTask) -> StepResult:
        print(f"started {task.step_id}", flush=True)
        pause = task.input.get("sleep", 0) if isinstance(task.input, dict) else 0
        await asyncio.sleep(float(pause))
        return StepResult(
            run_id=task.run_id,
            seq=task.seq,
            step_id=task.step_id,
            status="completed",
            output={"pid": os.getpid()},
        )

    await transport.step_server([ns.token], sleepy, concurrency=1)
    print("ready", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("url")
    serve.add_argument("prefix")
    serve.add_argument("token")
    serve.add_argument("--lock-duration-ms", type=int, default=30_000)
    serve.add_argument("--stalled-interval-ms", type=int, default=30_000)
    ns = parser.parse_args()
    asyncio.run(_serve(ns))


async def eventually(check: Any, timeout: float = 5.0, what: str = "condition") -> None:
    """Wait until `check()` is true (fails after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.05)


async def wait_for(check: Any, timeout: float = 15, what: str = "condition") -> Any:
    """`await check()` until it returns something truthy (returned), polling every 50 ms;
    fails after `timeout` seconds naming `what`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.05)


class CollectingSink:
    """A `ResultSink` that records every batch; `fail` decides per batch whether to raise."""

    max_payload_bytes = 4 * 1024 * 1024  # the engine's default

    def __init__(self, fail: Any = None) -> None:
        self.batches: list[list[Any]] = []
        self.refused = 0
        self._fail = fail
        self._changed = asyncio.Event()

    async def step_results(self, results: Any) -> None:
        batch = list(results)
        if self._fail is not None and self._fail(batch):
            self.refused += 1
            raise RuntimeError("the store is down")
        self.batches.append(batch)
        self._changed.set()

    @property
    def results(self) -> list[Any]:
        return [r for batch in self.batches for r in batch]

    def by_step(self) -> dict[str, Any]:
        return {r.step_id: r for r in self.results}

    async def wait_for(self, step_ids: Any, timeout: float = 15.0) -> dict[str, Any]:
        """Wait until a result for each of `step_ids` arrived; the latest of each."""
        wanted = set(step_ids)
        deadline = time.monotonic() + timeout
        while not wanted <= self.by_step().keys():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(wanted - self.by_step().keys())
                raise AssertionError(f"no result for {missing[:10]} ({len(missing)} missing)")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.5))
            except TimeoutError:
                pass
        return self.by_step()


__all__ = [
    "REDIS_URL",
    "CollectingSink",
    "delete_prefix",
    "eventually",
    "free_port",
    "redis_prefix",
    "redis_url",
    "require_redis",
    "step_server_process",
    "wait_for_line",
]

if __name__ == "__main__":
    main()
