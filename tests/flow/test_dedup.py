"""Dedup ids on start: `start(..., dedup_id=..., on_duplicate="return"|"raise")` on the
memory store, a SQLite file and PostgreSQL.

While a live run of the workflow (in the namespace) holds the dedup id, a start returns that
run's handle or raises `DuplicateRunError`, and creates nothing; once the run is completed,
failed, cancelled or dead the id is free again. The check and the insert are one store
transaction: concurrent starts from two clients (two processes' worth of connections) on
PostgreSQL end with exactly one run.
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
from durably import Client, DuplicateRunError, Engine, InMemoryStateStore, WorkflowCtx
from tests.pg_support import fresh_schema, schema_url

TIMEOUT = 15.0
FAST: dict[str, Any] = {"timer_poll_ms": 20, "lease_ms": 2000, "drain_timeout_ms": 2000}
_ids = itertools.count()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def target(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield InMemoryStateStore()
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'dedup.db'}"
    else:
        async with fresh_schema(create=False) as schema:
            yield schema_url(schema)


@pytest.fixture
def uid() -> str:
    return f"d{next(_ids)}-{uuid.uuid4().hex[:6]}"


def waiting_workflow(name: str) -> Any:
    @durably.workflow(name)
    async def wf(ctx: WorkflowCtx, token: str) -> str:
        return str(await ctx.wait_for_signal(token))

    return wf


async def test_a_live_run_holds_its_dedup_id_until_it_ends(target: Any, uid: str) -> None:
    wf = waiting_workflow(f"{uid}.wf")
    other = waiting_workflow(f"{uid}.other")
    async with Engine(target, workflows=[wf, other], **FAST), Client(target) as client:
        first = await client.start(wf, f"go:{uid}:1", run_id=f"{uid}-1", dedup_id="order-42")
        again = await client.start(wf, f"go:{uid}:2", run_id=f"{uid}-2", dedup_id="order-42")
        assert again.run_id == first.run_id
        assert await client.get_run(f"{uid}-2") is None
        by_name = await client.start(f"{uid}.wf", "x", dedup_id="order-42")
        assert by_name.run_id == first.run_id
        with pytest.raises(DuplicateRunError) as info:
            await client.start(wf, "x", dedup_id="order-42", on_duplicate="raise")
        err = info.value
        assert (err.workflow, err.dedup_id, err.run_id) == (f"{uid}.wf", "order-42", first.run_id)
        # another workflow, another namespace: another dedup id
        elsewhere = await client.start(other, f"go:{uid}:o", dedup_id="order-42")
        assert elsewhere.run_id != first.run_id
        tenant = await client.start(wf, "never", dedup_id="order-42", namespace="tenant-b")
        assert tenant.run_id != first.run_id
        # once the run is terminal the id is free again
        await client.signal(f"go:{uid}:1", "done")
        assert await first.result(timeout=TIMEOUT) == "done"
        fresh = await client.start(wf, f"go:{uid}:3", run_id=f"{uid}-3", dedup_id="order-42")
        assert fresh.run_id == f"{uid}-3"
        await client.cancel(fresh.run_id)  # a cancelled holder frees it as well
        last = await client.start(wf, f"go:{uid}:4", run_id=f"{uid}-4", dedup_id="order-42")
        assert last.run_id == f"{uid}-4"
        for token in (f"go:{uid}:o", f"go:{uid}:4"):
            await client.signal(token, "ok")
        assert await last.result(timeout=TIMEOUT) == "ok"
        await client.cancel(tenant.run_id)


async def test_an_existing_run_id_wins_over_the_dedup_id(target: Any, uid: str) -> None:
    """A start is idempotent by run id first: re-starting the same id returns it even when
    another live run holds the dedup id given."""
    wf = waiting_workflow(f"{uid}.wf")
    async with Client(target) as client:
        a = await client.start(wf, "t", run_id=f"{uid}-a", dedup_id="k1")
        await client.start(wf, "t", run_id=f"{uid}-b", dedup_id="k2")
        same = await client.start(wf, "t", run_id=f"{uid}-a", dedup_id="k2", on_duplicate="raise")
        assert same.run_id == a.run_id
        assert len(await client.list_runs()) == 2


async def test_bad_dedup_options_are_refused(uid: str) -> None:
    wf = waiting_workflow(f"{uid}.wf")
    async with Client(InMemoryStateStore()) as client:
        with pytest.raises(ValueError, match="dedup_id"):
            await client.start(wf, "t", dedup_id="")
        with pytest.raises(ValueError, match="on_duplicate"):
            await client.start(wf, "t", dedup_id="x", on_duplicate="ignore")  # type: ignore[call-overload]
        assert await client.list_runs() == []


async def test_concurrent_starts_with_one_dedup_id_make_one_run_on_postgresql(uid: str) -> None:
    wf = waiting_workflow(f"{uid}.wf")
    async with fresh_schema(create=False) as schema:
        url = schema_url(schema)
        async with Client(url) as one, Client(url) as two:
            handles = await asyncio.gather(
                *(
                    (one if n % 2 else two).start(
                        wf, "t", run_id=f"{uid}-{n}", dedup_id="payment-9"
                    )
                    for n in range(16)
                )
            )
            assert len({h.run_id for h in handles}) == 1
            assert len(await one.list_runs(workflow=f"{uid}.wf")) == 1
            outcomes = await asyncio.gather(
                *(
                    (one if n % 2 else two).start(
                        wf, "t", run_id=f"{uid}-r{n}", dedup_id="payment-9", on_duplicate="raise"
                    )
                    for n in range(4)
                ),
                return_exceptions=True,
            )
            assert all(isinstance(o, DuplicateRunError) for o in outcomes)
            assert len(await one.list_runs(workflow=f"{uid}.wf")) == 1


async def test_engine_start_takes_the_same_start_options(target: Any, uid: str) -> None:
    """`Engine.start` checks a dedup id and a per-start quota like `Client.start`."""
    wf = waiting_workflow(f"{uid}.wf")
    async with Engine(target, workflows=[wf], **FAST) as engine:
        first = await engine.start(wf, f"go:{uid}:1", dedup_id="job-7")
        again = await engine.start(wf, f"go:{uid}:2", dedup_id="job-7")
        assert again.run_id == first.run_id
        with pytest.raises(DuplicateRunError):
            await engine.start(wf, "x", dedup_id="job-7", on_duplicate="raise")
        quota = durably.ConcurrencyQuota(key=f"{uid}-k", limit=1)
        held = await engine.start(wf, f"go:{uid}:q", concurrency=quota)
        with pytest.raises(durably.ConcurrencyLimitError):
            await engine.start(wf, f"go:{uid}:r", concurrency=quota)
        run = await engine.get_run(held.run_id)
        assert run is not None and f"concurrency:{uid}-k" in (run.tags or ())
        await engine.signal(f"go:{uid}:1", "done")
        await engine.signal(f"go:{uid}:q", "done")
        assert await first.result(timeout=TIMEOUT) == "done"
        assert await held.result(timeout=TIMEOUT) == "done"
