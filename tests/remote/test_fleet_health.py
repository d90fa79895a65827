"""Worker health from the fleet, over real Redis with real workers: two published
durable-worker 0.26.1 processes (unmodified, run with their own `run_redis_worker`) and a
durably engine serving steps. An engine that only reads sees every one of them in
`worker_health()` — steps and workflows served, capabilities, concurrency limit, the steps in
flight right now and the queue's depth — and in `workflow_directory()` the onError routes the
two SDK workers announce differently. `durably runs workers` and the console's API answer the
same."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import durably
from durably import Engine, GroupHealth
from durably._core.handshake import LEGACY_V1_CAPABILITIES
from durably._core.wire import RemoteTask, step_id_of
from durably.dashboard import create_app
from durably.transports import RedisTransport
from tests.cli.support import cli_env
from tests.remote import redis_support
from tests.remote.durable_worker_env import durable_worker_python
from tests.remote.redis_support import wait_for_line

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(600)  # the first run builds the SDK's virtualenv

SDK_WORKER = """
import asyncio, sys
import durable_worker.redis_runner as runner
from durable_worker import Worker, run_redis_worker

url, prefix, tag, code = sys.argv[1:5]
# The SDK refreshes its liveness key every 10 s; every half second here, so the test reads the
# count of a step running now from the next beat instead of waiting 10 s for it.
runner._HEARTBEAT_INTERVAL_SECONDS = 0.5
worker = Worker(auto_register=False)


@worker.step(tag + ".slow")
async def slow(data):
    await asyncio.sleep(data["sleep"])
    return {"slept": data["sleep"]}


@worker.workflow(tag + ".order", version="2")
def order(ctx, data):
    return ctx.step(tag + ".slow", {"sleep": 0})


@order.on_error(code)
def handle(ctx, failure):
    return {"handled": failure["error"].get("code")}


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


@contextmanager
def sdk_worker(python: Path, url: str, prefix: str, tag: str, code: str) -> Iterator[str]:
    """A durable-worker process whose workflow routes failures with `code`; its instance id."""
    proc = subprocess.Popen(
        [str(python), "-c", SDK_WORKER, url, prefix, tag, code], stdout=subprocess.PIPE, text=True
    )
    try:
        wait_for_line(proc, "ready", 60)
        yield f"py-{socket.gethostname()}-{proc.pid}"
    finally:
        proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


async def eventually(
    read: Callable[[], Awaitable[Any]], check: Callable[[Any], bool], timeout: float = 15.0
) -> Any:
    """Read until `check` holds; the last value read (fails after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await read()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout}s; last read: {value!r}")
        await asyncio.sleep(0.1)


def by_group(groups: list[GroupHealth]) -> dict[str, GroupHealth]:
    return {g.group: g for g in groups}


def in_flight(group: GroupHealth | None) -> int:
    if group is None:
        return -1
    return sum(w.status.in_flight for w in group.live_workers if w.status is not None)


def task(tag: str, name: str, seq: int, data: Any) -> RemoteTask:
    run = f"{tag}-run"
    return RemoteTask(
        run_id=run,
        seq=seq,
        name=name,
        step_id=step_id_of(run, seq),
        group=name,
        input=data,
        attempt=1,
    )


async def test_worker_health_lists_durable_worker_and_durably_workers(
    sdk_python: Path, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    tag = f"fh{int(time.time() * 1000) % 10**8}"

    @durably.step(f"{tag}.resize")
    async def resize(seconds: float) -> float:
        await asyncio.sleep(seconds)
        return seconds

    # A durably step worker: steps only, beating every 0.2 s, announcing a capability.
    server_transport = RedisTransport(
        redis_url, prefix=redis_prefix, instance_id="durably-server", liveness_interval_s=0.2
    )
    server = Engine(
        "memory",
        transport=server_transport,
        role="worker",
        steps=[resize],
        capabilities=["gpu"],
        step_threads=3,
    )
    # The reader: drives nothing, consumes nothing (an observer), sees everything.
    store = f"sqlite:///{tmp_path / 'ops.db'}"
    reader = Engine(
        store,
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[],
        drive=False,
        role="worker",
    )
    with ExitStack() as stack:
        one = stack.enter_context(sdk_worker(sdk_python, redis_url, redis_prefix, tag, "declined"))
        two = stack.enter_context(sdk_worker(sdk_python, redis_url, redis_prefix, tag, "expired"))
        async with server, reader:
            slow, order, add = f"{tag}.slow", f"{tag}.order", f"{tag}.resize"
            groups = by_group(
                await eventually(
                    reader.worker_health,
                    lambda gs: (
                        {slow, order, add} <= set(by_group(gs))
                        and len(by_group(gs)[slow].live_workers) == 2
                    ),
                )
            )

            # durable-worker: both processes on the step's token, each as its descriptor says.
            steps = groups[slow]
            assert (steps.kind, steps.transport, steps.depth) == ("step", "default", 0)
            assert sorted(w.instance_id for w in steps.live_workers) == sorted([one, two])
            for w in steps.live_workers:
                assert w.status is not None
                assert (w.status.concurrency.mode, w.status.concurrency.limit) == ("fixed", 4)
                assert w.status.runtime == "python" and w.status.in_flight == 0
                assert abs(w.last_beat_at - time.time() * 1000) < 10_000
                d = w.descriptor
                assert d is not None
                assert (d.runtime, d.sdk, d.sdk_version) == ("python", "durable-worker", "0.26.1")
                assert d.steps == (slow,)
                assert order in d.workflows and f"{order}.onError.handle" in d.workflows
                assert d.capabilities == LEGACY_V1_CAPABILITIES
                assert (d.protocol, d.protocol_range) == (1, (1, 1))
            assert groups[order].kind == "workflow"
            assert len(groups[order].live_workers) == 2

            # durably's own step server: its instance, its step, its capability, its limit.
            [mine] = groups[add].live_workers
            assert groups[add].kind == "step"
            assert mine.instance_id == "durably-server"
            assert mine.status is not None and mine.status.concurrency.limit == 3
            assert mine.descriptor is not None
            assert (mine.descriptor.sdk, mine.descriptor.steps) == ("durably", (add,))
            assert mine.descriptor.capabilities == ("gpu",)

            # Steps running now: two on the SDK workers, one on durably's, counted by the next
            # beats; six more than the SDK workers' slots make the queue's depth.
            sender = RedisTransport(redis_url, prefix=redis_prefix)
            try:
                for seq in range(2):
                    await sender.dispatch(task(tag, slow, seq, {"sleep": 4}))
                await sender.dispatch(task(tag, add, 2, 4))
                busy = by_group(
                    await eventually(
                        reader.worker_health,
                        lambda gs: (
                            in_flight(by_group(gs).get(slow)) == 2
                            and in_flight(by_group(gs).get(add)) == 1
                        ),
                    )
                )
                assert busy[slow].depth == 2  # both tasks are active
                assert busy[add].depth == 1
                for seq in range(3, 3 + 12):
                    await sender.dispatch(task(tag, slow, seq, {"sleep": 4}))
                backlog = by_group(await reader.worker_health())[slow]
                assert backlog.depth >= 12  # two SDK workers hold at most 8 of the 14
                quiet = await eventually(
                    reader.worker_health,
                    lambda gs: (
                        in_flight(by_group(gs).get(slow)) == 0
                        and by_group(gs)[slow].depth == 0
                        and in_flight(by_group(gs).get(add)) == 0
                    ),
                    timeout=30,
                )
                assert by_group(quiet)[add].depth == 0
            finally:
                await sender.close()

            # The workflow directory: the two workers announce different onError routes.
            directory = await reader.workflow_directory()
            [announced] = [w for w in directory.workflows if w.key == f"{order}@2"]
            assert announced.evidence == "declared"
            assert announced.instances == tuple(sorted([one, two]))
            assert announced.groups == (order,)
            [disagreement] = announced.disagreements
            assert disagreement.axis == "onError"
            assert any('"declined"' in v for v in disagreement.values)
            assert any('"expired"' in v for v in disagreement.values)
            assert f"disagree on {order}@2" in directory.detail
            # the steps of durably's server and of the SDK workers are no workflow
            assert not any(w.evidence == "observed" for w in directory.workflows)

            # The JSON the console and `--json` print, one SDK worker's entry in full order.
            entry = next(
                w for w in by_group(await reader.worker_health())[slow].to_json()["liveWorkers"]
            )
            assert list(entry) == ["group", "instanceId", "lastBeatAt", "status", "descriptor"]
            assert list(entry["descriptor"]) == [
                "runtime",
                "sdk",
                "sdkVersion",
                "protocol",
                "protocolRange",
                "capabilities",
                "workflows",
                "steps",
                "startedAt",
            ]

            # The console's API answers the same.
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=create_app(reader)), base_url="http://localhost"
            ) as client:
                res = await client.get("/api/workers")
                assert res.status_code == 200
                listed = {g["group"]: g for g in res.json()}
                assert {w["instanceId"] for w in listed[slow]["liveWorkers"]} == {one, two}
                assert listed[add]["liveWorkers"][0]["descriptor"]["capabilities"] == ["gpu"]
                assert listed[slow]["transport"] == "default" and listed[slow]["kind"] == "step"
                res = await client.get("/api/workers/directory")
                assert res.status_code == 200
                body = res.json()
                assert body["supported"] is True
                [entry_json] = [w for w in body["workflows"] if w["key"] == f"{order}@2"]
                assert [d["axis"] for d in entry_json["disagreements"]] == ["onError"]
                bad = await client.get("/api/workers/directory?transport=default")
                assert bad.status_code == 400 and "`transport`" in bad.json()["message"]

            # `durably runs workers` against the same store and broker.
            cli = [sys.executable, "-m", "durably", "runs", "workers", "--store", store]
            cli += ["--transport", redis_url, "--prefix", redis_prefix]
            done = await asyncio.to_thread(
                subprocess.run,
                [*cli, "--json"],
                env=cli_env(),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stderr
            printed = json.loads(done.stdout)
            cli_groups = {g["group"]: g for g in printed["groups"]}
            assert {w["instanceId"] for w in cli_groups[slow]["liveWorkers"]} == {one, two}
            assert cli_groups[add]["liveWorkers"][0]["descriptor"]["steps"] == [add]
            [cli_entry] = [w for w in printed["directory"]["workflows"] if w["key"] == f"{order}@2"]
            assert cli_entry["disagreements"][0]["axis"] == "onError"
            text = await asyncio.to_thread(
                subprocess.run, cli, env=cli_env(), capture_output=True, text=True, timeout=60
            )
            assert text.returncode == 0, text.stderr
            out = text.stdout
            assert f"  {one}  python · durable-worker 0.26.1 · in flight 0/4" in out
            assert f"    steps:        {slow}" in out
            assert "    capabilities: gpu" in out
            assert f"  ! {order}@2: the workers disagree on onError" in out


async def test_a_queue_with_a_backlog_and_no_worker_is_the_alert(
    redis_url: str, redis_prefix: str
) -> None:
    # The engine sends this remote workflow's turns to `ghost-orders`, where nobody beats.
    ghost = durably.remote_workflow("ghost-orders")
    sender = RedisTransport(redis_url, prefix=redis_prefix)
    engine = Engine(
        "memory",
        transport=RedisTransport(redis_url, prefix=redis_prefix),
        workflows=[ghost],
        drive=False,
    )
    try:
        async with engine:
            assert [g for g in await engine.worker_health() if g.transport] == []
            for seq in range(3):
                await sender.dispatch(
                    RemoteTask(
                        run_id="g",
                        seq=seq,
                        name="x",
                        step_id=f"g:{seq}",
                        group="ghost-orders",
                        input=None,
                        attempt=1,
                    )
                )
            [alert] = [g for g in await engine.worker_health() if g.transport]
            assert (alert.group, alert.depth, alert.kind, alert.alert) == (
                "ghost-orders",
                3,
                "workflow",
                True,
            )
            assert alert.live_workers == ()
    finally:
        await sender.close()


async def test_an_unreachable_broker_leaves_the_stores_answer(tmp_path: Path) -> None:
    engine = Engine(
        f"sqlite:///{tmp_path / 'e.db'}",
        transport=RedisTransport("redis://127.0.0.1:1/0"),  # nothing listens there
        workflows=[],
        drive=False,
        role="worker",  # an observer: consumes nothing
    )
    async with engine:
        assert await engine.worker_health() == []
        directory = await engine.workflow_directory()
        assert directory.supported and directory.workflows == ()
        assert (
            "Transport 'default' could not be read: TransportUnavailableError" in directory.detail
        )
