"""Concurrency quotas: `@durably.workflow(concurrency=Concurrency(...))` and
`start(..., concurrency=ConcurrencyQuota(...))`, on the memory store, a SQLite file and
PostgreSQL.

A start beyond the key's limit raises `ConcurrencyLimitError` and creates nothing; the run
carries the tag `concurrency:<key>`; a finished run frees its slot; a child start refused by
its quota fails the parent's wait. On PostgreSQL, two processes' worth of concurrent starts
never exceed the limit (the count and the insert are one transaction under a per-key lock).
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import (
    Client,
    Concurrency,
    ConcurrencyLimitError,
    ConcurrencyQuota,
    Engine,
    InMemoryStateStore,
    RunFailedError,
    WorkflowCtx,
)
from tests.pg_support import fresh_schema, schema_url

TIMEOUT = 15.0
FAST: dict[str, Any] = {"timer_poll_ms": 20, "lease_ms": 2000, "drain_timeout_ms": 2000}
_ids = itertools.count()


class Stores:
    """One store per test: `engine()` and `client()` share it."""

    def __init__(self, kind: str, tmp_path: Path, pg_schema: str | None = None) -> None:
        self.kind = kind
        self._tmp = tmp_path
        self._schema = pg_schema
        self._memory = InMemoryStateStore() if kind == "memory" else None

    def target(self) -> Any:
        if self._memory is not None:
            return self._memory
        if self._schema is not None:
            return schema_url(self._schema)
        return f"sqlite:///{self._tmp / 'quota.db'}"

    def engine(self, **options: Any) -> Engine:
        return Engine(store=self.target(), **{**FAST, **options})

    def client(self) -> Client:
        return Client(self.target())


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Stores]:
    if request.param != "postgres":
        yield Stores(request.param, tmp_path)
        return
    async with fresh_schema(create=False) as schema:
        yield Stores("postgres", tmp_path, schema)


@pytest.fixture
def uid() -> str:
    return f"q{next(_ids)}-{uuid.uuid4().hex[:6]}"


def gated_workflow(uid: str, **options: Any) -> Any:
    """A workflow that waits for `go:<id>` and returns it; its key is the input's customer."""

    @durably.workflow(f"{uid}.wf", **options)
    async def wf(ctx: WorkflowCtx, inp: dict[str, str]) -> str:
        return str(await ctx.wait_for_signal(f"go:{inp['id']}"))

    return wf


async def test_a_start_beyond_the_key_limit_is_refused_and_creates_nothing(
    stores: Stores, uid: str
) -> None:
    wf = gated_workflow(uid, concurrency=Concurrency(key=lambda i: i["customer"], limit=2))
    async with stores.engine(workflows=[wf]) as engine:
        a1 = await engine.start(wf, {"id": "a1", "customer": "a"}, run_id=f"{uid}-a1")
        await engine.start(wf, {"id": "a2", "customer": "a"}, run_id=f"{uid}-a2")
        with pytest.raises(ConcurrencyLimitError) as info:
            await engine.start(wf, {"id": "a3", "customer": "a"}, run_id=f"{uid}-a3")
        err = info.value
        assert (err.workflow, err.key, err.limit, err.active) == (f"{uid}.wf", "a", 2, 2)
        assert str(err) == (
            f'concurrency limit reached for key "a" (2/2 in flight); {uid}.wf was not '
            "started — retry later"
        )
        assert await engine.get_run(f"{uid}-a3") is None
        # another key has its own slots; an idempotent re-start is never refused
        await engine.start(wf, {"id": "b1", "customer": "b"}, run_id=f"{uid}-b1")
        again = await engine.start(wf, {"id": "a1", "customer": "a"}, run_id=f"{uid}-a1")
        assert again.run_id == a1.run_id
        run = await engine.get_run(a1.run_id)
        assert run is not None and run.tags == ("concurrency:a",)
        # a finished run frees its slot
        await engine.signal("go:a1", "done")
        assert await a1.result(timeout=TIMEOUT) == "done"
        a3 = await engine.start(wf, {"id": "a3", "customer": "a"}, run_id=f"{uid}-a3")
        for token in ("go:a2", "go:a3", "go:b1"):
            await engine.signal(token, "ok")
        assert await a3.result(timeout=TIMEOUT) == "ok"


async def test_limit_function_key_none_and_count_statuses(stores: Stores, uid: str) -> None:
    asked: list[str] = []

    async def limit_of(key: str) -> int:
        asked.append(key)
        return 1

    wf = gated_workflow(
        uid,
        concurrency=Concurrency(
            key=lambda i: i.get("customer"),
            limit=limit_of,
            count_statuses=["pending", "running"],
        ),
    )
    async with stores.engine(workflows=[wf]) as engine:
        first = await engine.start(wf, {"id": "c1", "customer": "c"}, run_id=f"{uid}-c1")
        # pending counts: a second start is refused until the first parks on its signal
        with pytest.raises(ConcurrencyLimitError):
            await engine.start(wf, {"id": "c2", "customer": "c"}, run_id=f"{uid}-c2")
        await first.wait(timeout=TIMEOUT)  # suspended: not counted by these statuses
        second = await engine.start(wf, {"id": "c2", "customer": "c"}, run_id=f"{uid}-c2")
        # no key: no limit
        for n in range(3):
            await engine.start(wf, {"id": f"n{n}"}, run_id=f"{uid}-n{n}")
        for token in ("go:c1", "go:c2", "go:n0", "go:n1", "go:n2"):
            await engine.signal(token, "ok")
        assert await second.result(timeout=TIMEOUT) == "ok"
    assert asked[:2] == ["c", "c"]


async def test_the_start_quota_overrides_the_workflow_and_applies_without_one(
    stores: Stores, uid: str
) -> None:
    wf = gated_workflow(uid, concurrency=Concurrency(key=lambda i: "shared", limit=10))
    plain = gated_workflow(f"{uid}-plain")
    async with stores.engine(workflows=[wf, plain]) as engine, stores.client() as client:
        quota = ConcurrencyQuota("tenant-7", 1)
        h1 = await client.start(wf, {"id": "t1"}, run_id=f"{uid}-t1", concurrency=quota)
        run = await client.get_run(h1.run_id)
        assert run is not None and run.tags == ("concurrency:tenant-7",)
        # the key is global across workflows: a start of another workflow counts against it
        with pytest.raises(ConcurrencyLimitError) as info:
            await client.start(plain, {"id": "t2"}, run_id=f"{uid}-t2", concurrency=quota)
        assert (info.value.key, info.value.limit, info.value.active) == ("tenant-7", 1, 1)
        # By name (the client has no code, so no workflow quota): the start's own applies.
        # The name is one the fleet serves: an unserved one is refused before any quota.
        with pytest.raises(ConcurrencyLimitError) as zero:
            await client.start(
                plain.name, {}, run_id=f"{uid}-z", concurrency=ConcurrencyQuota("z", 0)
            )
        assert zero.value.active == 0
        assert await client.get_run(f"{uid}-z") is None
        await engine.signal("go:t1", "ok")
        assert await h1.result(timeout=TIMEOUT) == "ok"


async def test_bad_quota_options_are_refused_before_anything_is_created(uid: str) -> None:
    with pytest.raises(TypeError, match=r"durably\.Concurrency"):
        durably.workflow(f"{uid}.x", concurrency={"key": "k", "limit": 2})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown status 'paused'"):
        Concurrency(key=lambda i: "k", limit=1, count_statuses=["paused"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="limit"):
        ConcurrencyQuota("k", "2")  # type: ignore[arg-type]
    wf = gated_workflow(uid)
    async with Client(InMemoryStateStore()) as client:
        with pytest.raises(TypeError, match="ConcurrencyQuota"):
            await client.start(wf, {"id": "1"}, concurrency=("k", 1))  # type: ignore[call-overload]
        assert await client.list_runs() == []


async def test_a_child_refused_by_its_quota_fails_the_parent_wait(stores: Stores, uid: str) -> None:
    child = gated_workflow(f"{uid}-child", concurrency=Concurrency(key=lambda i: "k", limit=1))

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx, n: int) -> str:
        return str(await ctx.child(child, {"id": f"kid{n}"}))

    async with stores.engine(workflows=[child, parent]) as engine:
        holder = await engine.start(child, {"id": "holder"}, run_id=f"{uid}-holder")
        await holder.wait(timeout=TIMEOUT)
        refused = await engine.start(parent, 1, run_id=f"{uid}-p1")
        with pytest.raises(RunFailedError) as info:
            await refused.result(timeout=TIMEOUT)
        assert info.value.error is not None
        assert "concurrency limit reached" in info.value.error.message
        await engine.signal("go:holder", "ok")
        await holder.result(timeout=TIMEOUT)


async def test_a_fans_members_pass_their_quota_one_by_one(stores: Stores, uid: str) -> None:
    """Members of a workflow fan start as single starts would: the ones over the key's quota
    are not created and settle as failures naming the limit, the admitted ones carry the
    key's tag and count against later starts, and keys without a limit are not limited."""
    child = gated_workflow(
        f"{uid}-child", concurrency=Concurrency(key=lambda i: i.get("customer"), limit=2)
    )

    @durably.workflow(f"{uid}.parent")
    async def parent(ctx: WorkflowCtx) -> list[Any]:
        inputs = [{"id": f"m{n}", "customer": "a"} for n in range(4)] + [{"id": "free"}]
        settled = await ctx.all_settled(child, inputs)
        return [s.value if isinstance(s, durably.Fulfilled) else s.error for s in settled]

    async with stores.engine(workflows=[child, parent]) as engine:
        handle = await engine.start(parent, run_id=f"{uid}-p")
        members = [f"{uid}-p.all.0.{n}" for n in range(5)]

        async def created() -> list[str]:
            return [m for m in members if await engine.get_run(m) is not None]

        async with asyncio.timeout(TIMEOUT):
            while len(await created()) < 3:  # noqa: ASYNC110 - polls the store
                await asyncio.sleep(0.02)
        assert await created() == [members[0], members[1], members[4]]
        first = await engine.get_run(members[0])
        assert first is not None and "concurrency:a" in (first.tags or ())
        # the fan's live members hold the key's slots against any other start
        with pytest.raises(ConcurrencyLimitError):
            await engine.start(child, {"id": "x", "customer": "a"}, run_id=f"{uid}-x")
        for token in ("go:m0", "go:m1", "go:free"):
            await engine.signal(token, "ok")
        out = await handle.result(timeout=TIMEOUT)
    assert out[0] == out[1] == out[4] == "ok"
    for refused in (out[2], out[3]):
        assert isinstance(refused, str) and "concurrency limit reached" in refused, out
        assert 'for key "a" (2/2 in flight)' in refused


async def test_concurrent_starts_from_two_processes_never_exceed_the_limit_on_postgresql(
    tmp_path: Path, uid: str
) -> None:
    """Two clients (each its own connection pool, as two processes would have) race 20
    starts of one key with a limit of 3: exactly 3 runs exist afterwards."""
    wf = gated_workflow(uid, concurrency=Concurrency(key=lambda i: "hot", limit=3))
    async with fresh_schema(create=False) as schema:
        url = schema_url(schema)
        async with Client(url) as one, Client(url) as two:

            async def attempt(client: Client, n: int) -> bool:
                try:
                    await client.start(wf, {"id": str(n)}, run_id=f"{uid}-{n}")
                except ConcurrencyLimitError:
                    return False
                return True

            results = await asyncio.gather(*(attempt(one if n % 2 else two, n) for n in range(20)))
            assert sum(results) == 3
            assert await one.count_runs(tag="concurrency:hot") == 3
