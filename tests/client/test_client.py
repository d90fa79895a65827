"""`durably.Client` against a worker `Engine` on the same store (memory, SQLite, PostgreSQL):
every client method, with the client knowing the workflows only by name unless a test passes
the `Workflow` object."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

import durably
from durably import (
    Client,
    Engine,
    InputValidationError,
    ReservedTokenError,
    RunFailedError,
    RunIdConflictError,
)
from tests.client.conftest import FAST

WAIT = 20.0


@asynccontextmanager
async def worker_and_client(
    store: Any, *workflows: durably.Workflow[Any, Any]
) -> AsyncIterator[tuple[Engine, Client]]:
    async with Engine(store=store, workflows=workflows, **FAST) as engine:
        async with Client(store) as client:
            yield engine, client


async def wait_status(client: Client, run_id: str, *statuses: str) -> durably.WorkflowRun:
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        run = await client.get_run(run_id)
        if run is not None and run.status in statuses:
            return run
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"run {run_id} never reached {statuses}: {run}")
        await asyncio.sleep(0.02)


def gated_workflow(uid: str) -> durably.Workflow[Any, Any]:
    @durably.workflow(f"{uid}-gated")
    async def gated(ctx: durably.WorkflowCtx, name: str) -> dict[str, Any]:
        payload = await ctx.wait_for_signal(f"{uid}:go:{name}")
        return {"name": name, "payload": payload}

    return gated


# ---------------------------------------------------------------------------- start


async def test_start_by_name_is_executed_by_the_worker(store: Any, uid: str) -> None:
    @durably.workflow(f"{uid}-greet")
    async def greet(ctx: durably.WorkflowCtx, name: str) -> str:
        return f"hi {name}"

    async with worker_and_client(store, greet) as (_, client):
        handle = await client.start(f"{uid}-greet", "ann", run_id=f"{uid}-r1", tags=["t:x"])
        assert handle.run_id == f"{uid}-r1"
        assert await handle.result(timeout=WAIT) == "hi ann"
        assert await client.result(f"{uid}-r1", timeout=WAIT) == "hi ann"
        run = await client.get_run(f"{uid}-r1")
        assert run is not None and run.tags == ("t:x",)
        assert run.workflow_version == "1"  # pinned by the worker that drove it


async def test_start_by_name_without_version_runs_the_workers_newest(store: Any, uid: str) -> None:
    @durably.workflow(f"{uid}-v", version="1")
    async def v1(ctx: durably.WorkflowCtx) -> str:
        return "one"

    @durably.workflow(f"{uid}-v", version="2")
    async def v2(ctx: durably.WorkflowCtx) -> str:
        return "two"

    async with worker_and_client(store, v1, v2) as (_, client):
        newest = await client.start(f"{uid}-v")
        assert await newest.result(timeout=WAIT) == "two"
        run = await client.get_run(newest.run_id)
        assert run is not None and run.workflow_version == "2"
        pinned = await client.start(f"{uid}-v", version="1")
        assert await pinned.result(timeout=WAIT) == "one"


async def test_start_by_name_with_an_input_the_worker_rejects_fails_the_run(
    store: Any, uid: str
) -> None:
    @durably.workflow(f"{uid}-typed")
    async def typed(ctx: durably.WorkflowCtx, n: int) -> int:
        return n + 1

    async with worker_and_client(store, typed) as (_, client):
        handle = await client.start(f"{uid}-typed", {"not": "a number"})
        with pytest.raises(RunFailedError) as failed:
            await handle.result(timeout=WAIT)
        assert failed.value.status == "failed"
        assert failed.value.error is not None
        assert failed.value.error.message.startswith(f"invalid input for workflow '{uid}-typed'")


async def test_start_with_the_workflow_object_validates_before_creating(
    store: Any, uid: str
) -> None:
    @durably.workflow(f"{uid}-typed")
    async def typed(ctx: durably.WorkflowCtx, n: int) -> int:
        return n + 1

    async with worker_and_client(store, typed) as (_, client):
        with pytest.raises(InputValidationError):
            await client.start(typed, "not a number", run_id=f"{uid}-bad")
        assert await client.get_run(f"{uid}-bad") is None
        handle = await client.start(typed, 41)
        assert await handle.result(timeout=WAIT) == 42


async def test_start_is_idempotent_by_run_id_and_refuses_another_workflow(
    store: Any, uid: str
) -> None:
    gated = gated_workflow(uid)
    async with worker_and_client(store, gated) as (_, client):
        first = await client.start(f"{uid}-gated", "a", run_id=f"{uid}-same")
        again = await client.start(f"{uid}-gated", "b", run_id=f"{uid}-same")
        assert first.run_id == again.run_id
        assert await client.count_runs(workflow=f"{uid}-gated") == 1
        with pytest.raises(RunIdConflictError):
            await client.start(f"{uid}-other", None, run_id=f"{uid}-same")
        with pytest.raises(TypeError):
            await client.start("", None)


# ---------------------------------------------------------------------------- signals


async def test_signal_reaches_a_waiting_run_and_buffers_for_a_later_one(
    store: Any, uid: str
) -> None:
    gated = gated_workflow(uid)
    async with worker_and_client(store, gated) as (_, client):
        # Signalled before the run exists: buffered, then received by its wait.
        assert await client.signal(f"{uid}:go:early", {"n": 1}) is None
        assert await client.count_buffered_signals(prefix=f"{uid}:") == 1
        listed = await client.list_buffered_signals(prefix=f"{uid}:")
        assert [s.token for s in listed] == [f"{uid}:go:early"]
        early = await client.start(f"{uid}-gated", "early")
        assert await early.result(timeout=WAIT) == {"name": "early", "payload": {"n": 1}}

        late = await client.start(f"{uid}-gated", "late")
        await wait_status(client, late.run_id, "suspended")
        waiting = await client.waiting_for([late.run_id])
        assert late.run_id in waiting
        sent = await client.signal(f"{uid}:go:late", {"n": 2})
        assert sent is not None and sent.run_id == late.run_id
        assert await late.result(timeout=WAIT) == {"name": "late", "payload": {"n": 2}}

        assert await client.signal(f"{uid}:go:nobody", 1, buffer=False) is None
        assert await client.count_buffered_signals(prefix=f"{uid}:") == 0
        await client.signal(f"{uid}:go:purge-me", 1)
        assert await client.purge_buffered_signals(prefix=f"{uid}:go:purge") == 1
        with pytest.raises(ReservedTokenError):
            await client.signal(f"child:{late.run_id}", 1)


async def test_concurrent_signal_with_start_makes_one_run_receiving_both_signals(
    store: Any, uid: str
) -> None:
    @durably.workflow(f"{uid}-collect")
    async def collect(ctx: durably.WorkflowCtx, name: str) -> list[Any]:
        first = await ctx.wait_for_signal(f"{uid}:add")
        second = await ctx.wait_for_signal(f"{uid}:add")
        return sorted([first, second])

    async with worker_and_client(store, collect) as (_, client):
        async with Client(store) as other:
            handles = await asyncio.gather(
                client.signal_with_start(
                    f"{uid}-collect", "x", run_id=f"{uid}-one", token=f"{uid}:add", payload=1
                ),
                other.signal_with_start(
                    f"{uid}-collect", "x", run_id=f"{uid}-one", token=f"{uid}:add", payload=2
                ),
            )
        assert {h.run_id for h in handles} == {f"{uid}-one"}
        assert await client.count_runs(workflow=f"{uid}-collect") == 1
        assert await client.result(f"{uid}-one", timeout=WAIT) == [1, 2]


# ---------------------------------------------------------------------------- operator actions


async def test_cancel_a_waiting_run(store: Any, uid: str) -> None:
    gated = gated_workflow(uid)
    async with worker_and_client(store, gated) as (_, client):
        handle = await client.start(f"{uid}-gated", "c")
        await wait_status(client, handle.run_id, "suspended")
        cancelled = await client.cancel(handle.run_id)
        assert cancelled is not None and cancelled.status == "cancelled"
        with pytest.raises(RunFailedError) as failed:
            await handle.result(timeout=WAIT)
        assert failed.value.status == "cancelled"
        assert await client.cancel(f"{uid}-unknown") is None


async def test_retry_and_retry_with_input(store: Any, uid: str) -> None:
    broken = {"on": True}

    @durably.step(f"{uid}.check", retries=0)
    def check(n: int) -> int:
        if broken["on"] or n < 0:
            raise ValueError(f"broken for {n}")
        return n * 2

    @durably.workflow(f"{uid}-flaky")
    async def flaky(ctx: durably.WorkflowCtx, n: int) -> int:
        return await ctx.step(check, n)

    async with worker_and_client(store, flaky) as (_, client):
        handle = await client.start(f"{uid}-flaky", 3)
        with pytest.raises(RunFailedError):
            await handle.result(timeout=WAIT)
        broken["on"] = False
        retried = await client.retry(handle.run_id)
        assert retried is not None and retried.status == "pending"
        assert await handle.result(timeout=WAIT) == 6

        negative = await client.start(f"{uid}-flaky", -1)
        with pytest.raises(RunFailedError):
            await negative.result(timeout=WAIT)
        new_id = await client.retry_with_input(negative.run_id, 5)
        assert new_id is not None and new_id.startswith(f"{negative.run_id}~retry~")
        assert await client.result(new_id, timeout=WAIT) == 10
        assert await client.retry(f"{uid}-unknown") is None
        assert await client.retry_with_input(f"{uid}-unknown", 1) is None


async def test_continue_run_releases_a_breakpoint_and_delete_run_removes_it(
    store: Any, uid: str
) -> None:
    @durably.workflow(f"{uid}-paused")
    async def paused(ctx: durably.WorkflowCtx) -> str:
        await ctx.breakpoint("inspect")
        return "past"

    async with worker_and_client(store, paused) as (_, client):
        handle = await client.start(f"{uid}-paused")
        await wait_status(client, handle.run_id, "suspended")
        # the breakpoint row is written when the run suspends on it
        for _ in range(200):
            if await client.continue_run(handle.run_id) is not None:
                break
            await asyncio.sleep(0.02)
        assert await handle.result(timeout=WAIT) == "past"
        assert await client.continue_run(handle.run_id) is None
        assert await client.delete_run(handle.run_id) == 1
        assert await client.get_run(handle.run_id) is None


# ---------------------------------------------------------------------------- reading


async def test_read_api(store: Any, uid: str) -> None:
    @durably.workflow(f"{uid}-fan")
    async def fan(ctx: durably.WorkflowCtx, n: int) -> int:
        await ctx.set_event("seen", n)
        return n

    async with worker_and_client(store, fan) as (_, client):
        ids = [(await client.start(f"{uid}-fan", i, tags=[f"{uid}:t"])).run_id for i in range(3)]
        for rid in ids:
            await client.result(rid, timeout=WAIT)
        runs = await client.list_runs(workflow=f"{uid}-fan")
        assert sorted(r.id for r in runs) == sorted(ids)
        assert await client.count_runs(workflow=f"{uid}-fan") == 3
        facets = await client.run_facets(workflow=f"{uid}-fan")
        assert sum(row.count for row in facets if row.status == "completed") == 3
        values = await client.run_value_facets("workflow", None, workflow=f"{uid}-fan")
        assert [(row.value, row.count) for row in values] == [(f"{uid}-fan", 3)]
        detail = await client.get_run_detail(ids[0])
        assert detail is not None and detail.run.id == ids[0]
        assert await client.get_run_detail(f"{uid}-unknown") is None
        page = await client.get_fan_members(ids[0], "no-such-group")
        assert page is not None and page.total == 0
        assert await client.get_run_children(ids[0]) == []
        assert await client.get_event(ids[1], "seen") == 1
        assert await client.list_checkpoints(ids[0]) != []
        settled = await client.get_handle(ids[2]).wait(timeout=WAIT)
        assert settled.status == "completed"


async def test_codec_and_namespace(store: Any, uid: str) -> None:
    gated = gated_workflow(uid)
    codec = durably.AesGcmCodec(durably.AesGcmCodec.generate_key())
    async with Engine(store=store, workflows=[gated], codec=codec, **FAST):
        async with Client(store, codec=codec) as client:
            handle = await client.start(f"{uid}-gated", "secret", run_id=f"{uid}-enc")
            await wait_status(client, handle.run_id, "suspended")
            await client.signal(f"{uid}:go:secret", {"pin": 1234})
            assert await handle.result(timeout=WAIT) == {"name": "secret", "payload": {"pin": 1234}}
        async with Client(store) as plain:
            raw = await plain.get_run(f"{uid}-enc")
            assert raw is not None and raw.input != "secret"  # encrypted at rest
            elsewhere = await plain.start(f"{uid}-gated", "x", namespace="other")
            run = await plain.get_run(elsewhere.run_id)
            assert run is not None and run.namespace == "other"
        async with Client(store, namespace="tenant-b") as scoped:
            started = await scoped.start(f"{uid}-gated", "y")
            run = await scoped.get_run(started.run_id)
            assert run is not None and run.namespace == "tenant-b"


def test_bad_client_options_are_refused_naming_the_client() -> None:
    with pytest.raises(ValueError, match=r"Client\(signal_buffer_per_token=…\)"):
        Client("memory", signal_buffer_per_token=0)
    with pytest.raises(ValueError, match=r"Client\(signal_buffer_ttl="):
        Client("memory", signal_buffer_ttl="soon")
