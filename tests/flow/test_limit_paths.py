"""Limits that data or a path around them could skip.

- A value that reaches a text column through admission (a fairness key, a queue name, a
  concurrency or singleton key) holding a NUL or a lone surrogate is refused where it is
  given, with the argument named — not sent to the backend, whose refusal looked like an
  outage and was retried forever (a log line a second, the run never settling).
- A data error from an admission backend fails the step's call with the reason; only a
  connection-level failure is an outage.
- A start by name from a process without the workflow's code skipped the workflow's
  concurrency quota and singleton queue depth: the worker that takes the run (its first
  turn) checks them, and a run over the limit fails with the error a start would have
  raised.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import (
    Client,
    Concurrency,
    Engine,
    InMemoryStateStore,
    PayloadRejectedError,
    Queue,
    Singleton,
    WorkflowCtx,
)
from durably._core.admission import Admission, AdmissionBackend, FreedListener, QueueStats
from tests.pg_support import fresh_schema, schema_url
from tests.remote.redis_support import REDIS_URL, delete_prefix, require_redis

TIMEOUT = 20.0
FAST: dict[str, Any] = {"timer_poll_ms": 20, "lease_ms": 2000, "drain_timeout_ms": 2000}
OUTAGE = "the store failed during its turn"


class World:
    """One store (and admission backend) per test: `engine()` and `client()` share it."""

    def __init__(self, kind: str, tmp_path: Path, pg_schema: str | None = None) -> None:
        self.kind = kind
        self._tmp = tmp_path
        self._schema = pg_schema
        self._memory = InMemoryStateStore() if kind == "memory" else None
        self.redis_prefix = f"dtest-{uuid.uuid4().hex[:10]}"

    def target(self) -> Any:
        if self._memory is not None:
            return self._memory
        if self._schema is not None:
            return schema_url(self._schema)
        return f"sqlite:///{self._tmp / 'limits.db'}"

    def admission(self) -> Any:
        if self.kind == "redis":
            from durably._transport.redis_admission import RedisAdmission

            return RedisAdmission(REDIS_URL, prefix=f"{self.redis_prefix}-adm")
        return "auto"

    def engine(self, **options: Any) -> Engine:
        return Engine(store=self.target(), admission=self.admission(), **{**FAST, **options})

    def client(self) -> Client:
        return Client(self.target())


async def _world(kind: str, tmp_path: Path) -> AsyncIterator[World]:
    if kind == "postgres":
        async with fresh_schema(create=False) as schema:
            yield World(kind, tmp_path, schema)
        return
    if kind == "redis":
        await require_redis()
        world = World(kind, tmp_path)
        try:
            yield world
        finally:
            await delete_prefix(REDIS_URL, world.redis_prefix)
        return
    yield World(kind, tmp_path)


@pytest.fixture(params=["sqlite", "postgres", "redis"])
async def admission_world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    """SQLite (admission in-process), PostgreSQL (admission in the store), and a SQLite
    store with its slots counted on Redis."""
    async for world in _world(request.param, tmp_path):
        yield world


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store_world(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[World]:
    async for world in _world(request.param, tmp_path):
        yield world


@pytest.fixture
def uid() -> str:
    return f"l{uuid.uuid4().hex[:10]}"


async def _settled(engine: Engine, run_id: str, statuses: Sequence[str]) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while True:
        run = await engine.get_run(run_id)
        if run is not None and run.status in statuses:
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} is {run.status if run else None}, not {statuses}")
        await asyncio.sleep(0.02)


async def _tagged(engine: Engine, run_id: str, tag: str) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while True:
        run = await engine.get_run(run_id)
        if run is not None and tag in (run.tags or ()):
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} never got the tag {tag!r}: {run}")
        await asyncio.sleep(0.02)


def _outages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if OUTAGE in r.getMessage()]


# ------------------------------------------------------------------ text reaching admission


@pytest.mark.parametrize("bad", ["a\x00b", "a\ud800b"], ids=["nul", "surrogate"])
async def test_a_fairness_key_the_store_cannot_hold_is_refused_at_the_call(
    admission_world: World, uid: str, bad: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durably")

    @durably.step(f"{uid}.call")
    async def call(i: int) -> int:
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        try:
            await ctx.step(call, 1, queue="api", fairness_key=bad)
        except PayloadRejectedError as exc:
            # Caught in the body, the run goes on: the position was not claimed.
            return f"refused: {exc}; then {await ctx.step(call, 2, queue='api')}"
        return "admitted"

    queues = [Queue("api", concurrency=1, fairness="key", retry=0.05)]
    async with admission_world.engine(workflows=[wf], steps=[call], queues=queues) as engine:
        out = await engine.execute(wf, run_id=f"{uid}-r", timeout=TIMEOUT)
    assert out.startswith("refused: ctx.step(fairness_key=...) refused: holds a ")
    assert out.endswith("; then 2")
    assert _outages(caplog) == []


async def test_a_queue_name_with_a_nul_is_refused_at_the_call(
    admission_world: World, uid: str
) -> None:
    @durably.step(f"{uid}.call")
    async def call(i: int) -> int:
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        try:
            await ctx.step(call, 1, queue="api\x00")
        except PayloadRejectedError as exc:
            return str(exc)
        return "ran"

    queues = [Queue("api", concurrency=1, retry=0.05)]
    async with admission_world.engine(workflows=[wf], steps=[call], queues=queues) as engine:
        out = await engine.execute(wf, run_id=f"{uid}-r", timeout=TIMEOUT)
    assert out == "ctx.step(queue=...) refused: holds a NUL character"


class _Garbling:
    """The real backend, handed a key it cannot store (as a value that got past every check
    would be): what a backend's data error does to a step."""

    def __init__(self, inner: AdmissionBackend, suffix: str) -> None:
        self._inner, self._suffix = inner, suffix

    async def acquire(self, queue: Queue, holder: str, *, key: str, priority: int = 0) -> Admission:
        return await self._inner.acquire(queue, holder, key=key + self._suffix, priority=priority)

    async def release(self, *holders: str) -> int:
        return await self._inner.release(*holders)

    async def renew(self, holders: Any) -> set[str]:
        return await self._inner.renew(holders)

    def on_freed(self, listener: FreedListener) -> None:
        self._inner.on_freed(listener)

    async def stats(self, queues: Sequence[Queue]) -> list[QueueStats]:
        return await self._inner.stats(queues)

    async def close(self) -> None:
        await self._inner.close()


@pytest.mark.parametrize("kind", ["postgres", "redis"])
async def test_a_data_error_of_the_backend_fails_the_step_call_not_an_outage(
    kind: str, tmp_path: Path, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durably")

    @durably.step(f"{uid}.call")
    async def call(i: int) -> int:
        return i

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        return await ctx.step(call, 1, queue="api")

    queues = [Queue("api", concurrency=1, retry=0.05)]
    async for world in _world(kind, tmp_path):
        async with world.engine(workflows=[wf], steps=[call], queues=queues) as engine:
            inner = engine._worker.flow.backend
            # PostgreSQL refuses a NUL in text; no UTF-8 encoder takes a lone surrogate.
            engine._worker.flow._backend = _Garbling(
                inner, "\x00" if kind == "postgres" else "\ud800"
            )
            handle = await engine.start(wf, run_id=f"{uid}-r")
            run = await _settled(engine, handle.run_id, ["failed", "completed"])
            engine._worker.flow._backend = inner
    assert run.status == "failed"
    assert run.error is not None
    assert "flow-control admission to queue 'api' refused" in run.error.message
    assert _outages(caplog) == []


@pytest.mark.parametrize("kind", ["postgres", "redis"])
async def test_a_backend_names_a_value_it_cannot_hold(kind: str, tmp_path: Path) -> None:
    queue = Queue("api", concurrency=1)
    async for world in _world(kind, tmp_path):
        if kind == "redis":
            from durably._transport.redis_admission import RedisAdmission

            backend: Any = RedisAdmission(REDIS_URL, prefix=f"{world.redis_prefix}-adm")
            bad = "k\ud800"
            store = None
        else:
            from durably._store.sql import SqlStateStore
            from durably._store.sql.admission import PgAdmission

            store = SqlStateStore.from_url(world.target())
            await store.ensure_schema()
            backend = PgAdmission(store, owner="A", clock=lambda: 1_700_000_000_000)
            bad = "k\x00"
        try:
            with pytest.raises(PayloadRejectedError, match="flow-control admission to queue 'api'"):
                await backend.acquire(queue, "r:0", key=bad)
            assert (await backend.acquire(queue, "r:0", key="k")).admitted  # nothing stuck
        finally:
            await backend.close()
            if store is not None:
                await store.close()


async def test_a_singleton_key_with_a_nul_fails_a_run_started_by_name(
    store_world: World, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durably")

    @durably.workflow(f"{uid}.wf", singleton=Singleton(key=lambda i: f"k\x00{i['id']}"))
    async def wf(ctx: WorkflowCtx, inp: dict[str, str]) -> str:
        return inp["id"]

    async with store_world.engine(workflows=[wf]) as engine, store_world.client() as client:
        handle = await client.start(f"{uid}.wf", {"id": "a"}, run_id=f"{uid}-a")
        run = await _settled(engine, handle.run_id, ["failed", "completed"])
    assert run.status == "failed"
    assert run.error is not None
    assert "the key refused: holds a NUL character" in run.error.message
    assert _outages(caplog) == []


# ------------------------------------------------------------------ a start by name


def _gated(uid: str, **options: Any) -> Any:
    @durably.workflow(f"{uid}.wf", **options)
    async def wf(ctx: WorkflowCtx, inp: dict[str, str]) -> str:
        return str(await ctx.wait_for_signal(f"go:{uid}:{inp['id']}"))

    return wf


async def test_a_start_by_name_over_the_workflows_quota_fails_when_taken(
    store_world: World, uid: str
) -> None:
    wf = _gated(uid, concurrency=Concurrency(key=lambda i: i["customer"], limit=1))
    async with store_world.engine(workflows=[wf]) as engine, store_world.client() as client:
        # The client has no code: its starts check nothing of the workflow's quota.
        first = await client.start(f"{uid}.wf", {"id": "a1", "customer": "a"}, run_id=f"{uid}-1")
        run = await _settled(engine, first.run_id, ["running", "suspended"])
        assert run.tags == ("concurrency:a",)  # the worker tagged it at its first turn
        second = await client.start(f"{uid}.wf", {"id": "a2", "customer": "a"}, run_id=f"{uid}-2")
        over = await _settled(engine, second.run_id, ["failed", "running", "suspended"])
        other = await client.start(f"{uid}.wf", {"id": "b1", "customer": "b"}, run_id=f"{uid}-3")
        await _settled(engine, other.run_id, ["running", "suspended"])  # its own key's slot
        await engine.signal(f"go:{uid}:a1", "done")
        await engine.signal(f"go:{uid}:b1", "done")
        assert await engine.wait_for_run(first.run_id, timeout=TIMEOUT) is not None
        done = await _settled(engine, first.run_id, ["completed"])
        assert done.output == "done"
        # The slot is free again: the next start by name runs.
        third = await client.start(f"{uid}.wf", {"id": "a4", "customer": "a"}, run_id=f"{uid}-4")
        await _settled(engine, third.run_id, ["running", "suspended"])
        await engine.signal(f"go:{uid}:a4", "ok")
        await _settled(engine, third.run_id, ["completed"])
    assert over.status == "failed"
    assert over.error is not None
    assert over.error.message == (
        f'concurrency limit reached for key "a" (1/1 in flight); {uid}.wf was not started — '
        "retry later"
    )


async def test_a_start_by_name_over_the_singleton_queue_depth_fails_when_taken(
    store_world: World, uid: str
) -> None:
    wf = _gated(uid, singleton=Singleton(key=lambda i: i["account"], max_queue_depth=1))
    async with store_world.engine(workflows=[wf]) as engine, store_world.client() as client:
        runs = []
        for n in range(3):
            handle = await client.start(
                f"{uid}.wf", {"id": f"a{n}", "account": "acct"}, run_id=f"{uid}-{n}"
            )
            runs.append(handle.run_id)
            # Taken one after the other: the holder runs, the second waits, the third is over.
            if n == 0:
                await _tagged(engine, handle.run_id, "durable:singleton:admitted")
            elif n == 1:
                await _tagged(engine, handle.run_id, "singleton:acct")
                await _settled(engine, handle.run_id, ["suspended"])
        over = await _settled(engine, runs[2], ["failed", "completed"])
        waiter = await engine.get_run(runs[1])
        assert waiter is not None and "durable:singleton:admitted" not in (waiter.tags or ())
        await engine.signal(f"go:{uid}:a0", "one")
        await _settled(engine, runs[0], ["completed"])
        await _settled(engine, runs[1], ["running", "suspended"])
        await engine.signal(f"go:{uid}:a1", "two")
        await _settled(engine, runs[1], ["completed"])
    assert over.status == "failed"
    assert over.error is not None
    assert over.error.message == (f'singleton queue for {uid}.wf key "acct" is full (1 waiting)')
