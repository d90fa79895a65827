"""RedisTransport against a real Redis: dispatch, durably's own step server, the results
consumer (batches, malformed results, a failing sink), liveness keys, the control and beat
channels, and a serving process killed mid-step."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from typing import Any

import pytest
import redis.asyncio as aioredis
from bullmq import Queue

from durably._core.handshake import WorkerDescriptor, descriptor_hash, normalize_descriptor
from durably._core.wire import RemoteTask, StepResult, step_id_of
from durably._transport.redis import (
    ControlMessage,
    ResultIntake,
    RunBeat,
    TenantTokenRefusedError,
    WorkerTiming,
)
from durably.transports import RedisTransport, TransportPool, TransportUnavailableError
from tests.remote import redis_support
from tests.remote.redis_support import (
    CollectingSink,
    eventually,
    free_port,
    step_server_process,
    wait_for_line,
)

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(60)


def task(run: str, seq: int, group: str = "echo", **fields: Any) -> RemoteTask:
    return RemoteTask(
        run_id=run,
        seq=seq,
        name=fields.pop("name", group.split("@")[0]),
        step_id=step_id_of(run, seq),
        group=group,
        input=fields.pop("input", {"n": seq}),
        attempt=1,
        **fields,
    )


def completed(t: RemoteTask, output: Any) -> StepResult:
    return StepResult(
        run_id=t.run_id, seq=t.seq, step_id=t.step_id, status="completed", output=output
    )


async def echo(t: RemoteTask) -> StepResult:
    return completed(t, {"echo": t.input, "group": t.group})


def result_json(run: str, seq: int, **extra: Any) -> dict[str, Any]:
    step_id = step_id_of(run, seq)
    return {"runId": run, "seq": seq, "stepId": step_id, "status": "completed", **extra}


async def jobs_in(url: str, queue: str, *states: str) -> list[Any]:
    q = Queue(queue, {"connection": url})
    try:
        return await q.getJobs(list(states))
    finally:
        await q.close()


async def counts(url: str, queue: str) -> dict[str, int]:
    q = Queue(queue, {"connection": url})
    try:
        return await q.getJobCounts()
    finally:
        await q.close()


async def drained(url: str, queue: str, timeout: float = 5.0) -> None:
    """Wait until `queue` holds no job in any state (every one acknowledged and removed)."""
    deadline = time.monotonic() + timeout
    while any((now := await counts(url, queue)).values()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{queue} still holds {now}")
        await asyncio.sleep(0.05)


@pytest.fixture
async def transport(redis_url: str, redis_prefix: str) -> Any:
    made: list[RedisTransport] = []

    def make(**options: Any) -> RedisTransport:
        options.setdefault("prefix", redis_prefix)
        t = RedisTransport(redis_url, **options)
        made.append(t)
        return t

    yield make
    for t in made:
        await t.close()


async def test_round_trip_through_durablys_own_step_server(transport: Any) -> None:
    engine = transport(instance_id="engine")
    sink = CollectingSink()
    await engine.start(sink)
    await engine.start(sink)  # idempotent: still one consumer
    server = await engine.step_server(["echo", "other@acme"], echo, concurrency=4)
    tasks = [task("r1", i) for i in range(5)] + [task("r2", 0, group="other@acme")]
    for t in tasks:
        await engine.dispatch(t)
    got = await sink.wait_for(t.step_id for t in tasks)
    assert got["r1:3"].status == "completed"
    assert got["r1:3"].output == {"echo": {"n": 3}, "group": "echo"}
    assert got["r2:0"].output == {"echo": {"n": 0}, "group": "other@acme"}
    await server.drain(5)
    assert len(sink.results) == len(tasks)


async def test_step_jobs_carry_the_wire_options_and_the_broker_priority(
    transport: Any, redis_url: str, redis_prefix: str
) -> None:
    engine = transport()
    urgent = task("r", 0, priority=5)
    plain = task("r", 1)
    await engine.dispatch(urgent)
    await engine.dispatch(plain)
    queue = f"{redis_prefix}-tasks-echo"
    [prioritized] = await jobs_in(redis_url, queue, "prioritized")
    [waiting] = await jobs_in(redis_url, queue, "waiting")
    assert prioritized.name == "task" and waiting.name == "task"
    assert prioritized.data == urgent.to_json() and prioritized.data["priority"] == 5
    assert prioritized.opts["priority"] == 1_048_571  # higher engine priority → lower number
    assert "priority" not in waiting.opts
    for job in (prioritized, waiting):
        assert job.opts["removeOnComplete"] is True
        assert job.opts["removeOnFail"] == {"age": 86400}
    raw = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert await raw.hget(f"bull:{queue}:{prioritized.id}", "priority") == "1048571"
    finally:
        await raw.aclose()


async def test_a_namespaced_transport_refuses_tenant_tokens_and_the_pool_fails_over(
    transport: Any, redis_url: str, redis_prefix: str
) -> None:
    namespaced = transport(namespace="dev")
    bare = transport()
    assert namespaced.names.tasks("echo") == f"{redis_prefix}-dev-tasks-echo"
    with pytest.raises(TenantTokenRefusedError, match="echo@acme"):
        await namespaced.dispatch(task("r", 0, group="echo@acme"))
    with pytest.raises(TenantTokenRefusedError):
        await namespaced.step_server(["echo@acme"], echo, concurrency=1)
    await namespaced.dispatch(task("r", 1))  # a bare token is fine
    pool = TransportPool([("dev", namespaced), ("shared", bare)])
    assert await pool.dispatch(task("r", 2, group="echo@acme")) == "shared"
    raw = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert not [k async for k in raw.scan_iter(match=f"bull:{redis_prefix}-dev-tasks-echo@*")]
    finally:
        await raw.aclose()
    [tenant_job] = await jobs_in(redis_url, f"{redis_prefix}-tasks-echo@acme", "waiting")
    assert tenant_job.data["transport"] == "shared"
    [dev_job] = await jobs_in(redis_url, f"{redis_prefix}-dev-tasks-echo", "waiting")
    assert dev_job.data["stepId"] == "r:1"


async def test_an_unreachable_redis_is_reported_with_its_address() -> None:
    port = free_port()
    dead = RedisTransport(f"redis://127.0.0.1:{port}", prefix="nobody")
    started = time.monotonic()
    try:
        with pytest.raises(TransportUnavailableError, match=f"127.0.0.1:{port}"):
            await dead.dispatch(task("r", 0))
        with pytest.raises(TransportUnavailableError, match=f"127.0.0.1:{port}"):
            await dead.start(CollectingSink())
    finally:
        await dead.close()
    assert time.monotonic() - started < 10


async def test_malformed_results_are_logged_and_dropped_while_good_ones_settle(
    transport: Any, redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="durably.redis")
    engine = transport()
    sink = CollectingSink()
    await engine.start(sink)
    results = Queue(f"{redis_prefix}-results", {"connection": redis_url})
    opts = {"removeOnComplete": True, "removeOnFail": True}
    try:
        await results.add("result", result_json("good", 0, output=1), opts)
        bad_seq = await results.add("result", result_json("bad", 0) | {"seq": "zero"}, opts)
        bad_failed = await results.add("result", result_json("bad", 1) | {"status": "failed"}, opts)
        bad_text = await results.add("result", "not an object", opts)
        bad_id = await results.add("result", result_json("bad", 2) | {"stepId": "bad:9"}, opts)
        await results.add("result", result_json("good", 1, output=2), opts)
        got = await sink.wait_for(["good:0", "good:1", "bad:1"])
        await asyncio.sleep(0.3)
        # A result that names its step readably fails that attempt instead of leaving it
        # waiting; one that does not is dropped.
        assert sorted(sink.by_step()) == ["bad:1", "good:0", "good:1"]
        refused = got["bad:1"]
        assert refused.status == "failed" and refused.error is not None
        assert refused.error.code == "invalid_result" and refused.error.retryable is False
        assert "a failed result needs `error`" in refused.error.message
        await results.add("result", result_json("good", 2, output=3), opts)  # still consuming
        await sink.wait_for(["good:2"])
    finally:
        await results.close()
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for job, step in ((bad_seq, "bad:0"), (bad_failed, "bad:1"), (bad_id, "bad:9")):
        assert f"job {job.id} " in logged and f"step {step}" in logged, logged
    assert f"job {bad_text.id} " in logged
    await drained(redis_url, f"{redis_prefix}-results")


async def test_a_sink_that_raises_gets_the_results_again(transport: Any) -> None:
    calls = {"n": 0}

    def down_twice(batch: list[StepResult]) -> bool:
        calls["n"] += 1
        return calls["n"] <= 2

    engine = transport(intake=ResultIntake(retry_backoff_s=0.05))
    sink = CollectingSink(fail=down_twice)
    await engine.start(sink)
    server = await engine.step_server(["echo"], echo, concurrency=2)
    tasks = [task("r", i) for i in range(3)]
    for t in tasks:
        await engine.dispatch(t)
    await sink.wait_for(t.step_id for t in tasks)
    assert sink.refused == 2
    await server.drain(5)


async def test_a_result_the_sink_keeps_refusing_is_requeued_not_lost(
    transport: Any, redis_url: str, redis_prefix: str
) -> None:
    """One result the sink cannot apply does not hold back the others of its batch; it is put
    back on the queue and reaches a sink that can apply it (here another engine's)."""
    intake = ResultIntake(sink_attempts=2, retry_backoff_s=0.02, requeue_delay_ms=300)
    first = transport(intake=intake)
    refusing = CollectingSink(fail=lambda batch: any(r.step_id == "r:0" for r in batch))
    await first.start(refusing)
    results = Queue(f"{redis_prefix}-results", {"connection": redis_url})
    opts = {"removeOnComplete": True, "removeOnFail": True}
    try:
        await results.addBulk(
            [{"name": "result", "data": result_json("r", i), "opts": opts} for i in range(8)]
        )
        await refusing.wait_for([f"r:{i}" for i in range(1, 8)])
        assert "r:0" not in refusing.by_step()
        await asyncio.sleep(1.0)  # it keeps coming back and being refused
        assert refusing.refused >= 3
    finally:
        await results.close()
    await first.close()
    second = transport(intake=intake)
    accepting = CollectingSink()
    await second.start(accepting)
    got = await accepting.wait_for(["r:0"])
    assert got["r:0"].status == "completed"
    await asyncio.sleep(0.2)
    await drained(redis_url, f"{redis_prefix}-results")


async def test_a_wide_fan_settles_in_batches(
    transport: Any, redis_url: str, redis_prefix: str
) -> None:
    engine = transport()

    class StoreLikeSink(CollectingSink):
        async def step_results(self, results: Any) -> None:
            await asyncio.sleep(0.01)  # one transaction per batch, whatever its size
            await super().step_results(results)

    sink = StoreLikeSink()
    results = Queue(f"{redis_prefix}-results", {"connection": redis_url})
    opts = {"removeOnComplete": True, "removeOnFail": True}
    n = 3000
    try:
        for start in range(0, n, 500):
            await results.addBulk(
                [
                    {"name": "result", "data": result_json("fan", i), "opts": opts}
                    for i in range(start, min(n, start + 500))
                ]
            )
    finally:
        await results.close()
    started = time.monotonic()
    await engine.start(sink)
    await sink.wait_for([f"fan:{i}" for i in range(n)], timeout=40)
    took = time.monotonic() - started
    sizes = [len(b) for b in sink.batches]
    # BullMQ hands over one job per call (~700 a second here), so a batch holds what arrived
    # while the previous one was applied: several results per call, never one call each.
    assert max(sizes) <= 100
    assert len(sizes) < n / 3, f"{len(sizes)} batches"
    print(f"{n} results in {took:.1f}s, {len(sizes)} batches, mean {n / len(sizes):.1f}")


async def test_the_step_server_honours_its_concurrency_across_tokens(transport: Any) -> None:
    engine = transport()
    sink = CollectingSink()
    await engine.start(sink)
    running = {"now": 0, "most": 0}

    async def slow(t: RemoteTask) -> StepResult:
        running["now"] += 1
        running["most"] = max(running["most"], running["now"])
        await asyncio.sleep(0.15)
        running["now"] -= 1
        return completed(t, None)

    server = await engine.step_server(["a", "b"], slow, concurrency=2)
    tasks = [task("r", i, group="ab"[i % 2]) for i in range(8)]
    for t in tasks:
        await engine.dispatch(t)
    await sink.wait_for(t.step_id for t in tasks)
    assert running["most"] == 2
    await server.drain(5)


async def test_drain_lets_the_steps_in_hand_finish(transport: Any) -> None:
    engine = transport()
    sink = CollectingSink()
    await engine.start(sink)
    started = asyncio.Event()

    async def slow(t: RemoteTask) -> StepResult:
        started.set()
        await asyncio.sleep(0.5)
        return completed(t, "done")

    server = await engine.step_server(["slow"], slow, concurrency=1)
    await engine.dispatch(task("r", 0, group="slow"))
    await asyncio.wait_for(started.wait(), 10)
    t0 = time.monotonic()
    await server.drain(5)
    assert 0.3 < time.monotonic() - t0 < 4
    got = await sink.wait_for(["r:0"])
    assert got["r:0"].output == "done"


async def test_jobs_that_are_not_steps_fail_and_a_broken_step_job_reports_a_retryable_failure(
    transport: Any, redis_url: str, redis_prefix: str
) -> None:
    engine = transport()
    sink = CollectingSink()
    await engine.start(sink)
    ran: list[str] = []

    async def record(t: RemoteTask) -> StepResult:
        ran.append(t.step_id)
        return completed(t, None)

    await engine.step_server(["mixed"], record, concurrency=2)
    queue = Queue(f"{redis_prefix}-tasks-mixed", {"connection": redis_url})
    try:
        turn = {"taskId": "w:wf:00000000", "runId": "w", "workflow": "mixed", "history": []}
        await queue.add("workflow", turn, {"removeOnComplete": True, "removeOnFail": True})
        broken = task("b", 0, group="mixed").to_json() | {"attempt": "first"}
        await queue.add("task", broken, {"removeOnComplete": True, "removeOnFail": {"age": 86400}})
        await engine.dispatch(task("ok", 0, group="mixed"))
        got = await sink.wait_for(["ok:0", "b:0"])
    finally:
        await queue.close()
    assert ran == ["ok:0"]
    failure = got["b:0"]
    assert failure.status == "failed" and failure.error is not None
    assert failure.error.retryable is True and failure.started_at is None
    assert failure.error.message.startswith("remote step worker failed: ")
    await asyncio.sleep(0.3)
    assert not any(r.run_id == "w" for r in sink.results)  # a turn is never bridged


async def test_liveness_keys_of_a_step_server(
    transport: Any, redis_url: str, redis_prefix: str
) -> None:
    engine = transport(instance_id="srv-1")
    descriptor = WorkerDescriptor(
        instance_id="srv-1", runtime="python", steps=("echo",), started_at=1_700_000_000_000
    )
    server = await engine.step_server(
        ["echo", "echo@acme"], echo, concurrency=3, descriptor=descriptor
    )
    raw = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        key = f"{redis_prefix}-worker-heartbeat:echo:srv-1"
        ttl = await raw.ttl(key)
        assert 30 <= ttl <= 35
        value = json.loads(await raw.get(key))
        assert abs(value["ts"] - time.time() * 1000) < 5000
        assert value["status"]["concurrency"] == {"mode": "fixed", "limit": 3}
        assert value["status"]["inFlight"] == 0
        assert value["descriptorHash"] == descriptor_hash(descriptor)
        desc_key = f"{redis_prefix}-worker-descriptor:echo@acme:srv-1"
        assert normalize_descriptor(await raw.get(desc_key)) == descriptor
        beats = await engine.read_worker_heartbeats("echo")
        assert [(b.token, b.instance_id) for b in beats] == [("echo", "srv-1")]
        assert beats[0].descriptor_hash == descriptor_hash(descriptor)
        assert beats[0].status is not None and beats[0].status["inFlight"] == 0
        assert await engine.list_worker_groups() == {"echo", "echo@acme"}
        [one] = await engine.read_worker_descriptors()  # one per instance
        assert normalize_descriptor(one) == descriptor
        assert len(await engine.read_worker_descriptors("echo")) == 1
        await server.drain(5)
        assert not await raw.exists(key, desc_key)
    finally:
        await raw.aclose()


async def test_liveness_values_in_every_form_a_reader_meets(
    transport: Any, redis_url: str, redis_prefix: str
) -> None:
    engine = transport()
    current = {"ts": 1_700_000_000_123, "status": {"inFlight": 2}, "descriptorHash": "h"}
    values = {
        "now": json.dumps(current),
        "bare-ms": "1700000000123",
        "bare-sec": "1700000000",
        "json-sec": json.dumps({"ts": 1700000000.5}),
        "odd": json.dumps({"ts": "soon", "status": "up"}),
        "garbage": "{not json",
    }
    raw = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for instance, value in values.items():
            await raw.set(f"{redis_prefix}-worker-heartbeat:tok:{instance}", value, ex=35)
        await raw.set(f"{redis_prefix}-worker-heartbeat:no-instance", "1", ex=35)
    finally:
        await raw.aclose()
    beats = {b.instance_id: b for b in await engine.read_worker_heartbeats()}
    assert {i: b.last_beat_at for i, b in beats.items()} == {
        "now": 1_700_000_000_123,
        "bare-ms": 1_700_000_000_123,
        "bare-sec": 1_700_000_000_000,
        "json-sec": 1_700_000_000_500,
        "odd": 0,
        "garbage": 0,
    }
    assert beats["now"].status == {"inFlight": 2} and beats["now"].descriptor_hash == "h"
    assert beats["odd"].status is None
    assert await engine.list_worker_groups() == {"tok"}


async def test_control_messages_reach_other_instances_only(
    transport: Any, redis_url: str, redis_prefix: str
) -> None:
    one = transport(instance_id="one")
    two = transport(instance_id="two")
    seen: list[ControlMessage] = []

    async def on_message(message: ControlMessage) -> None:
        seen.append(message)

    await one.subscribe_control(on_message)
    await one.cancel_run("mine")  # our own: dropped
    raw = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        await raw.publish(f"{redis_prefix}-control", "not json")
        await raw.publish(f"{redis_prefix}-control", json.dumps({"kind": "cancel"}))
        sdk_event = {
            "kind": "event",
            "from": "py-host-1",
            "event": {"type": "step.progress", "runId": "r", "seq": 0, "at": 1700000000000},
        }
        await raw.publish(f"{redis_prefix}-control", json.dumps(sdk_event))
    finally:
        await raw.aclose()
    await two.cancel_run("theirs")
    await eventually(lambda: len(seen) >= 2)
    await asyncio.sleep(0.2)
    assert [(m.kind, m.sender, m.run_id) for m in seen] == [
        ("event", "py-host-1", None),
        ("cancel", "two", "theirs"),
    ]
    assert seen[0].event is not None
    assert seen[0].event["type"] == "step.progress" and seen[0].event["runId"] == "r"


async def test_run_beats_are_parsed_and_malformed_ones_dropped(
    transport: Any, redis_url: str, redis_prefix: str
) -> None:
    engine = transport()
    beats: list[RunBeat] = []
    await engine.subscribe_run_beats(beats.append)
    raw = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        channel = f"{redis_prefix}-heartbeat"
        await raw.publish(channel, json.dumps({"runId": "r", "seq": 0, "group": "wf"}))
        await raw.publish(channel, json.dumps({"runId": "r", "seq": -1, "group": "wf"}))
        await raw.publish(channel, "[]")
        beat = {"runId": "s", "seq": 4.0, "group": "g", "stepId": "s:4"}
        await raw.publish(channel, json.dumps(beat))
    finally:
        await raw.aclose()
    await eventually(lambda: len(beats) >= 2)
    await asyncio.sleep(0.2)
    assert beats == [RunBeat("r", 0, "wf"), RunBeat("s", 4, "g", "s:4")]


async def test_a_server_killed_mid_step_is_replaced_by_another(
    transport: Any, redis_url: str, redis_prefix: str
) -> None:
    """BullMQ's stall check puts the dead server's job back; another server runs it."""
    timing = {"lock_duration_ms": 1500, "stalled_interval_ms": 500}
    engine = transport(timing=WorkerTiming(**timing))
    sink = CollectingSink()
    await engine.start(sink)
    with step_server_process(redis_url, redis_prefix, "slow", **timing) as victim:
        await asyncio.to_thread(wait_for_line, victim, "ready", 20)
        await engine.dispatch(task("k", 0, group="slow", input={"sleep": 60}))
        await asyncio.to_thread(wait_for_line, victim, "started k:0", 10)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(5)
    killed_at = time.monotonic()
    ran_here: list[str] = []

    async def here(t: RemoteTask) -> StepResult:
        ran_here.append(t.step_id)
        return completed(t, {"pid": os.getpid()})

    await engine.step_server(["slow"], here, concurrency=1)
    got = await sink.wait_for(["k:0"], timeout=20)
    assert ran_here == ["k:0"]
    assert got["k:0"].output == {"pid": os.getpid()}
    assert time.monotonic() - killed_at < 15
