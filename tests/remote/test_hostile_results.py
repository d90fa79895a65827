"""Step results written by an outsider on the results queue an engine consumes, over real Redis.

Each test plays a broker writer (or a worker) with nothing but the `bullmq` package and raw
Redis commands: it reads the task the engine queued, then adds a result job on
`<prefix>-results`. What must hold:

- a result that parses but cannot be stored (`NaN`, `Infinity`, a lone surrogate, a time no
  date can hold, a nesting too deep, bytes that are not UTF-8) is logged once and never
  re-queued; when it names its step readably it fails that attempt with `invalid_result`,
  else it is dropped and the results behind it still settle;
- a result over `max_payload_bytes` fails its attempt with `result_too_large`, naming the size
  and the option, and nothing of it is stored;
- a late answer of an earlier attempt never settles the current one: judged by its `startedAt`
  against the attempt's dispatch (a durable-worker result), or by the `attempt` it names (a
  durably worker's).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from bullmq import Queue

import durably
from durably import WorkflowCtx
from durably.transports import RedisTransport
from tests.remote import redis_support

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

pytestmark = pytest.mark.timeout(120)

RESULT_OPTS = {"removeOnComplete": True, "removeOnFail": True}
ANY_STATE = ["waiting", "active", "delayed", "prioritized", "completed", "failed", "paused"]


async def until(check: Callable[[], Awaitable[Any]], timeout: float, what: str) -> Any:
    """The first truthy value of `check()` (fails after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s")
        await asyncio.sleep(0.05)


class Outsider:
    """What a broker writer sees and does: the task queue of one step token, the results
    queue, and raw Redis."""

    def __init__(self, url: str, prefix: str, token: str):
        self.url = url
        self.prefix = prefix
        self.tasks = Queue(f"{prefix}-tasks-{token}", {"connection": url})
        self.results = Queue(f"{prefix}-results", {"connection": url})
        self.redis = aioredis.Redis.from_url(url)

    async def close(self) -> None:
        await self.tasks.close()
        await self.results.close()
        await self.redis.aclose()

    async def task(self, attempt: int, timeout: float = 20) -> Any:
        """The queued task job of `attempt` (waits for the engine to queue it)."""

        async def find() -> Any:
            try:
                jobs = await self.tasks.getJobs(["waiting", "prioritized", "delayed", "active"])
            except ValueError:  # the package's getJobs raises on an empty queue
                return None
            return next((j for j in jobs if j.data.get("attempt") == attempt), None)

        return await until(find, timeout, f"the task of attempt {attempt}")

    async def add(self, data: dict[str, Any]) -> str:
        job = await self.results.add("result", data, RESULT_OPTS)
        return str(job.id)

    async def add_raw(self, text: str | bytes, field: str = "data") -> str:
        """A result job whose `field` (its data, by default) is `text` exactly (what
        `Queue.add` would never write: `NaN`, a nesting too deep to encode): added delayed,
        the field replaced in the job's hash, then promoted so the engine takes it."""
        job = await self.results.add("result", {}, {**RESULT_OPTS, "delay": 3_600_000})
        await self.redis.hset(f"bull:{self.prefix}-results:{job.id}", field, text)
        await job.promote()
        return str(job.id)

    async def results_drained(self, timeout: float = 15) -> None:
        """Every result job was taken and acknowledged: nothing waits, runs, or was put back
        (a re-queued result is a delayed job)."""

        async def empty() -> bool:
            counts = await self.results.getJobCounts(*ANY_STATE)
            return not any(counts.values())

        await until(empty, timeout, "an empty results queue")


def ids_of(task: Any) -> dict[str, Any]:
    data = task.data
    return {"runId": data["runId"], "seq": data["seq"], "stepId": data["stepId"]}


def raw_ids(task: Any) -> str:
    """The ids of a task's result as the opening of a JSON object's text."""
    return json.dumps(ids_of(task), separators=(",", ":"))[:-1]


def engine_for(tmp_path: Path, url: str, prefix: str, wf: Any, **options: Any) -> durably.Engine:
    return durably.Engine(
        f"sqlite:///{tmp_path / 'e.db'}",
        transport=RedisTransport(url, prefix=prefix),
        workflows=[wf],
        steps=[],  # nobody serves the step: the test answers it
        **options,
    )


async def run_status(engine: durably.Engine, run_id: str, wanted: str, timeout: float = 20) -> Any:
    async def reached() -> Any:
        run = await engine.get_run(run_id)
        return run if run is not None and run.status == wanted else None

    return await until(reached, timeout, f"run {run_id} {wanted}")


def refusals(caplog: pytest.LogCaptureFixture, job_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "durably.redis" and f"job {job_id} " in r.getMessage()
    ]


# ------------------------------------------------------------------ values the store cannot hold

UNSTORABLE = {
    "nan_in_output": lambda ids: ids + ',"status":"completed","output":{"v":NaN},"startedAt":1}',
    "infinity_in_error_details": lambda ids: (
        ids + ',"status":"failed","error":{"message":"m","details":{"x":-Infinity}}}'
    ),
    "started_at_1e20": lambda ids: ids + ',"status":"completed","output":1,"startedAt":1e20}',
    "lone_surrogate": lambda ids: ids + ',"status":"completed","output":"a\\ud800b"}',
    "bytes_not_utf8": lambda ids: (ids + ',"status":"completed","output":"').encode() + b'\xff"}',
    "deep_nesting": lambda ids: (
        ids + ',"status":"completed","output":' + "[" * 200_000 + "]" * 200_000 + "}"
    ),
}


@pytest.mark.parametrize("case", sorted(UNSTORABLE))
async def test_an_unstorable_result_fails_its_attempt_once_and_is_not_requeued(
    case: str, redis_url: str, redis_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    tag = f"u{os.getpid()}{case.replace('_', '')}"

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> object:
        return await ctx.step(f"{tag}.s", x, retries=3)

    outsider = Outsider(redis_url, redis_prefix, f"{tag}.s")
    try:
        async with engine_for(tmp_path, redis_url, redis_prefix, wf) as engine:
            handle = await engine.start(wf, 1, run_id=f"{tag}-r")
            task = await outsider.task(attempt=1)
            job_id = await outsider.add_raw(UNSTORABLE[case](raw_ids(task)))
            # Not retryable: a result the store cannot hold would be the same next time.
            run = await run_status(engine, handle.run_id, "failed")
            await outsider.results_drained()
            rows = await engine.list_checkpoints(handle.run_id)
    finally:
        await outsider.close()
    [row] = [r for r in rows if r.seq == task.data["seq"]]
    assert row.status == "failed" and row.attempts == 1 and row.output is None
    assert row.error is not None and row.error.code == "invalid_result"
    assert row.error.message.startswith("step result refused: ")
    assert row.error.retryable is False
    assert run.error is not None and "step result refused" in run.error.message
    logged = refusals(caplog, job_id)
    assert len(logged) == 1, logged
    assert task.data["stepId"] in logged[0]


UNREADABLE = {
    "seq_1e20": lambda run_id: (
        json.dumps({"runId": run_id, "seq": 1e20, "stepId": f"{run_id}:100000000000000000000"})[:-1]
        + ',"status":"completed","output":1}'
    ),
    "deep_nesting_alone": lambda run_id: "[" * 200_000,
    "nul_in_run_id": lambda run_id: json.dumps(
        {"runId": run_id + "\x00", "seq": 0, "stepId": run_id + "\x00:0", "status": "completed"}
    ),
}


async def test_results_that_name_no_step_are_dropped_once_and_the_rest_still_settle(
    redis_url: str, redis_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    tag = f"d{os.getpid()}"

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> object:
        return await ctx.step(f"{tag}.s", x)

    outsider = Outsider(redis_url, redis_prefix, f"{tag}.s")
    try:
        async with engine_for(tmp_path, redis_url, redis_prefix, wf) as engine:
            handle = await engine.start(wf, 1, run_id=f"{tag}-r")
            task = await outsider.task(attempt=1)
            bad = {
                case: await outsider.add_raw(make(handle.run_id))
                for case, make in sorted(UNREADABLE.items())
            }
            # A job whose options BullMQ itself cannot parse.
            bad["opts_too_deep"] = await outsider.add_raw("[" * 200_000, field="opts")
            await outsider.add({**ids_of(task), "status": "completed", "output": {"ok": 1}})
            assert await handle.result(timeout=20) == {"ok": 1}
            await outsider.results_drained()
    finally:
        await outsider.close()
    for case, job_id in bad.items():
        assert len(refusals(caplog, job_id)) == 1, (case, refusals(caplog, job_id))


# ------------------------------------------------------------------ results over the size limit


@pytest.mark.parametrize(
    ("limit", "ids_last"),
    [(None, False), (64 * 1024, True)],
    ids=["default_4_MiB_ids_first", "64_KiB_ids_after_the_output"],
)
async def test_a_result_over_max_payload_bytes_fails_its_attempt_and_stores_nothing(
    limit: int | None,
    ids_last: bool,
    redis_url: str,
    redis_prefix: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    tag = f"big{os.getpid()}{'l' if ids_last else 'f'}"

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> object:
        return await ctx.step(f"{tag}.s", x, retries=3)

    effective = limit if limit is not None else 4 * 1024 * 1024
    options = {} if limit is None else {"max_payload_bytes": limit}
    outsider = Outsider(redis_url, redis_prefix, f"{tag}.s")
    try:
        async with engine_for(tmp_path, redis_url, redis_prefix, wf, **options) as engine:
            handle = await engine.start(wf, 1, run_id=f"{tag}-r")
            task = await outsider.task(attempt=1)
            output = {"blob": "x" * (effective + 1000), "n": list(range(100))}
            body = {"status": "completed", "output": output, "startedAt": task.timestamp}
            data = {**body, **ids_of(task)} if ids_last else {**ids_of(task), **body}
            job_id = await outsider.add(data)
            run = await run_status(engine, handle.run_id, "failed")
            await outsider.results_drained()
            rows = await engine.list_checkpoints(handle.run_id)
    finally:
        await outsider.close()
    [row] = [r for r in rows if r.seq == task.data["seq"]]
    assert row.status == "failed" and row.attempts == 1 and row.output is None
    assert row.error is not None and row.error.code == "result_too_large"
    assert row.error.retryable is False
    size = len(json.dumps(data, separators=(",", ":")))
    assert f"{size} bytes is over the limit of {effective} bytes" in row.error.message
    assert "max_payload_bytes" in row.error.message
    assert row.error.details == {"size": size, "limit": effective}
    assert run.error is not None and "max_payload_bytes" in run.error.message
    assert len(refusals(caplog, job_id)) == 1


# ------------------------------------------------------------------ a late answer loses


@pytest.mark.parametrize("worker", ["durable-worker", "durably"])
async def test_a_late_answer_of_a_timed_out_attempt_does_not_settle_the_retry(
    worker: str, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    """Attempt 1 is never answered and times out; attempt 2 is dispatched; attempt 1's fatal
    failure arrives late, then attempt 2's success: the run completes with attempt 2's output.

    A durable-worker result carries no attempt: it is told apart by its `startedAt` (when its
    worker took attempt 1's task) against attempt 2's dispatch. A durably worker's result
    names its attempt, so its `startedAt` may be anything (here: the present)."""
    tag = f"late{os.getpid()}{worker[:3]}"

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> object:
        return await ctx.step(f"{tag}.s", x, timeout=5, retries=2, backoff_ms=500)

    outsider = Outsider(redis_url, redis_prefix, f"{tag}.s")
    try:
        async with engine_for(tmp_path, redis_url, redis_prefix, wf) as engine:
            handle = await engine.start(wf, 1, run_id=f"{tag}-r")
            first = await outsider.task(attempt=1)
            second = await outsider.task(attempt=2, timeout=30)  # attempt 1 timed out
            late: dict[str, Any] = {
                **ids_of(first),
                "status": "failed",
                "error": {"message": "attempt 1 failed late", "code": "LATE", "retryable": False},
            }
            if worker == "durable-worker":
                late["startedAt"] = first.timestamp  # it took attempt 1's task when queued
            else:
                late |= {"attempt": 1, "startedAt": int(time.time() * 1000)}
            await outsider.add(late)
            await outsider.results_drained()
            run = await engine.get_run(handle.run_id)
            assert run is not None and run.status not in ("failed", "completed"), run
            pending = [
                r for r in await engine.list_checkpoints(handle.run_id) if r.kind == "remote"
            ]
            assert [(r.status, r.attempts) for r in pending] == [("pending", 2)]

            answer = {
                **ids_of(second),
                "status": "completed",
                "output": {"attempt": 2},
                "startedAt": int(time.time() * 1000),
            }
            if worker == "durably":
                answer["attempt"] = 2
            await outsider.add(answer)
            assert await handle.result(timeout=20) == {"attempt": 2}
    finally:
        await outsider.close()
