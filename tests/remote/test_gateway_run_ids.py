"""Tenant start-runs through the real gateway over real Redis, with signed tenant tokens: an
operator `Engine` with a `RedisTransport` (and `tenant_token_secret`) is the control plane.

- A run id is unique across namespaces. Tenant `evil` starts `invoice-42` and `op-job-7`
  first; `acme`'s start of `invoice-42` is then refused as a run id conflict and logged with
  its ids (it used to be a silent no-op), and the operator's `engine.start(charge,
  run_id="op-job-7")` raises `RunIdConflictError` (it used to return evil's run). On memory,
  SQLite and PostgreSQL.
- Text a store cannot hold (a NUL in a tag, a search attribute, the workflow name), sent as
  raw BullMQ `startRun` jobs, is refused at the boundary: each bad message is logged once
  with its ids and dropped, never retried or re-queued, and a good start-run behind them
  creates its run. On PostgreSQL, whose text columns refuse a NUL.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import RunIdConflictError, TenantGateway, WorkflowCtx
from durably.tenant import TenantRequestError
from durably.transports import RedisTransport
from tests.pg_support import fresh_schema, schema_url
from tests.remote import redis_support
from tests.remote.redis_support import wait_for

redis_url = redis_support.redis_url
redis_prefix = redis_support.redis_prefix

SECRET = "a-test-secret-of-enough-length"
WAIT = 20.0


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield durably.InMemoryStateStore()
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'control.db'}"
    else:
        async with fresh_schema(create=False) as schema:
            yield schema_url(schema)


@pytest.fixture
async def pg_store() -> AsyncIterator[str]:
    async with fresh_schema(create=False) as schema:
        yield schema_url(schema)


@pytest.fixture
def uid() -> str:
    return f"rid{uuid.uuid4().hex[:8]}"


def charge_workflow(uid: str) -> durably.Workflow[Any, Any]:
    @durably.workflow(f"{uid}.charge")
    async def charge(ctx: WorkflowCtx, amount: int) -> dict[str, Any]:
        return {"charged": amount, "by": ctx.run_id}

    return charge


@asynccontextmanager
async def control_plane(
    store: Any, url: str, prefix: str, *workflows: durably.Workflow[Any, Any]
) -> AsyncIterator[durably.Engine]:
    """The operator's engine (drives every namespace), answering tenants over its
    transport and requiring signed tenant tokens."""
    engine = durably.Engine(
        store,
        transport=RedisTransport(url, prefix=prefix),
        workflows=list(workflows),
        namespace=None,
        tenant_token_secret=SECRET,
        timer_poll_ms=50,
    )
    async with engine:
        yield engine


def tenant(url: str, prefix: str, name: str) -> TenantGateway:
    return TenantGateway(url, token=TenantGateway.mint_token(SECRET, name), prefix=prefix)


def dropped_lines(caplog: pytest.LogCaptureFixture, run_id: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if "dropped start-run job" in r.getMessage() and repr(run_id)[:60] in r.getMessage()
    ]


async def settled(engine: durably.Engine, run_id: str) -> durably.WorkflowRun:
    """The run once it exists (a start-run travels as a message) and is terminal."""
    await wait_for(lambda: engine.get_run(run_id), WAIT, f"run {run_id} created")
    return await engine.wait_for_run(run_id, timeout=WAIT, until="terminal")


async def test_a_run_id_of_another_tenant_is_a_conflict_through_the_gateway(
    store: Any,
    redis_url: str,
    redis_prefix: str,
    uid: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="durably")
    charge = charge_workflow(uid)
    invoice, op_job = f"{uid}-invoice-42", f"{uid}-op-job-7"
    async with (
        control_plane(store, redis_url, redis_prefix, charge) as engine,
        tenant(redis_url, redis_prefix, "evil") as evil,
        tenant(redis_url, redis_prefix, "acme") as acme,
    ):
        await evil.start(charge.name, 666, run_id=invoice)
        await evil.start(charge.name, 666, run_id=op_job)
        for run_id in (invoice, op_job):
            run = await settled(engine, run_id)
            assert run.namespace == "evil" and run.status == "completed"

        # acme's start of the same id is refused and logged, not silently taken as done.
        await acme.start(charge.name, 100, run_id=invoice)

        async def refused() -> list[str]:
            return dropped_lines(caplog, invoice)

        lines = await wait_for(refused, WAIT, "acme's start-run logged as a conflict")
        assert len(lines) == 1 and "another namespace" in lines[0], lines
        assert "tenant" in lines[0] and "acme" in lines[0]
        with pytest.raises(TenantRequestError) as info:
            await acme.get_run_detail(invoice)
        assert info.value.code == "cross-tenant"  # still evil's run, untouched
        run = await engine.get_run(invoice)
        assert run is not None and run.namespace == "evil" and run.input == 666

        # The operator's start never hands back a tenant's run.
        with pytest.raises(RunIdConflictError):
            await engine.start(charge, 5, run_id=op_job)
        with pytest.raises(RunIdConflictError):
            await engine.start(charge, 5, run_id=op_job, dedup_id=f"{uid}-d")

        # The idempotent case still holds: acme's own id sent twice is one run, no conflict.
        await acme.start(charge.name, 1, run_id=f"{uid}-acme-own")
        await acme.start(charge.name, 1, run_id=f"{uid}-acme-own")
        done = await settled(engine, f"{uid}-acme-own")
        assert done.namespace == "acme"
        assert done.output == {"charged": 1, "by": f"{uid}-acme-own"}
        assert dropped_lines(caplog, f"{uid}-acme-own") == []


async def test_raw_start_runs_with_a_nul_are_dropped_once_and_the_next_one_starts(
    pg_store: str,
    redis_url: str,
    redis_prefix: str,
    uid: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from bullmq import Queue

    caplog.set_level(logging.WARNING, logger="durably")
    charge = charge_workflow(uid)
    token = TenantGateway.mint_token(SECRET, "acme")

    def message(run_id: str, **fields: Any) -> dict[str, Any]:
        return {
            "tenant": "acme",
            "token": token,
            "workflow": charge.name,
            "input": 1,
            "runId": run_id,
            **fields,
        }

    bad = [
        message(f"{uid}-tag", tags=["fine", "bad\x00tag"]),
        message(f"{uid}-value", searchAttributes={"customer": "a\x00b"}),
        message(f"{uid}-key", searchAttributes={"cu\x00stomer": "a"}),
        message(f"{uid}-name", workflow=f"{uid}.char\x00ge"),
    ]
    async with control_plane(pg_store, redis_url, redis_prefix, charge) as engine:
        queue = Queue(f"{redis_prefix}-start-run", {"connection": redis_url})
        try:
            opts = {"removeOnComplete": True, "removeOnFail": True}
            for data in bad:
                await queue.add("startRun", data, opts)
            await queue.add("startRun", message(f"{uid}-good"), opts)

            run = await settled(engine, f"{uid}-good")
            assert run.status == "completed" and run.namespace == "acme"

            async def all_dropped() -> bool:
                return all(dropped_lines(caplog, str(m["runId"])) for m in bad)

            await wait_for(all_dropped, WAIT, "every bad start-run logged as dropped")

            async def queue_empty() -> bool:
                counts = await queue.getJobCounts("wait", "active", "delayed")
                return not any(counts.values())

            # Nothing was put back on the queue to be tried again.
            await wait_for(queue_empty, WAIT, "an empty start-run queue")
        finally:
            await queue.close()
        for data in bad:
            assert await engine.get_run(str(data["runId"])) is None
    for data in bad:
        lines = dropped_lines(caplog, str(data["runId"]))
        assert len(lines) == 1, lines  # once, with its ids
        assert "NUL" in lines[0] and "acme" in lines[0]
    retried = [r.getMessage() for r in caplog.records if "failed (attempt" in r.getMessage()]
    assert retried == []


async def test_the_store_refusing_data_is_told_apart_from_an_outage(pg_store: str) -> None:
    """What the gateway drops instead of retrying: PostgreSQL's own refusal of a value (here
    a NUL written past the engine's checks, straight into the store) is a data error; a store
    that cannot be reached is not (that start-run is retried until the run exists)."""
    from durably import WorkflowRun
    from durably._core.models import now_utc
    from durably._engine.gateway.server import _is_data_error

    now = now_utc()
    run = WorkflowRun(
        id="nul-tag",
        workflow="w",
        workflow_version="",
        status="pending",
        input=None,
        tags=("bad\x00tag",),
        namespace="acme",
        created_at=now,
        updated_at=now,
    )
    async with durably.Client(pg_store) as client:
        with pytest.raises(Exception) as refused:
            await client.store.create_run(run)
    assert _is_data_error(refused.value)
    unreachable = durably.Client("postgresql+asyncpg://postgres@127.0.0.1:1/test")
    with pytest.raises(Exception) as down:
        await unreachable.get_run("x")
    assert not _is_data_error(down.value)
