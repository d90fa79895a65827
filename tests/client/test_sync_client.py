"""`durably.SyncClient`: the Client's verbs for synchronous code, against a real SQLite file
and PostgreSQL, with an Engine in the test driving the runs.

The test's event loop runs the engine, so every SyncClient call is made from another thread
(`asyncio.to_thread`) — as a Django or Flask request thread makes it."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Engine, SyncClient, WorkflowCtx
from tests.client.conftest import FAST
from tests.client.test_verb_parity import public_verbs, shape_of
from tests.engine_support import RESULT_TIMEOUT
from tests.pg_support import fresh_schema, schema_url


@pytest.fixture(params=["sqlite", "postgres"])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sync.db'}"
    else:
        async with fresh_schema(create=False) as schema:
            yield schema_url(schema)


def test_sync_client_has_the_clients_verbs_with_the_same_signatures_and_none_async():
    client = public_verbs(durably.Client)
    sync = public_verbs(SyncClient)
    assert set(sync) == set(client)
    for name in sorted(client):
        assert shape_of(sync[name]) == shape_of(client[name]), name
        assert not inspect.iscoroutinefunction(sync[name]), name


async def test_a_run_started_from_a_sync_client_is_run_by_an_engine_and_read_synchronously(
    url: str, uid: str
):
    @durably.workflow(f"{uid}.double")
    async def double(ctx: WorkflowCtx, x: int) -> int:
        return x * 2

    @durably.workflow(f"{uid}.waiter")
    async def waiter(ctx: WorkflowCtx) -> str:
        return str(await ctx.wait_for_signal(f"{uid}.go"))

    async with Engine(url, workflows=[double, waiter], **FAST):

        def request_handler() -> dict[str, Any]:
            with SyncClient(url) as client:
                handle = client.start(f"{uid}.double", 21, run_id=f"{uid}-d")
                out = handle.result(timeout=RESULT_TIMEOUT)
                status = handle.status()
                again = client.result(handle.run_id, timeout=RESULT_TIMEOUT)
                w = client.start(f"{uid}.waiter", run_id=f"{uid}-w")
                suspended = client.get_handle(w.run_id).wait(timeout=RESULT_TIMEOUT)
                client.signal(f"{uid}.go", "yes")
                return {
                    "out": out,
                    "status": status,
                    "again": again,
                    "suspended": suspended.status,
                    "signalled": w.result(timeout=RESULT_TIMEOUT),
                    "listed": sorted(r.id for r in client.list_runs()),
                    "run": client.get_run(handle.run_id),
                }

        got = await asyncio.to_thread(request_handler)
    assert got["out"] == got["again"] == 42
    assert got["status"] == "completed"
    assert got["suspended"] == "suspended"
    assert got["signalled"] == "yes"
    assert got["listed"] == [f"{uid}-d", f"{uid}-w"]
    assert got["run"].status == "completed"


async def test_one_sync_client_serves_four_threads_at_once(url: str, uid: str):
    @durably.workflow(f"{uid}.inc")
    async def inc(ctx: WorkflowCtx, x: int) -> int:
        return x + 1

    barrier = threading.Barrier(4)
    threads: set[str] = set()

    async with Engine(url, workflows=[inc], **FAST):
        client = await asyncio.to_thread(SyncClient, url)
        try:

            def job(i: int) -> int:
                threads.add(threading.current_thread().name)
                barrier.wait(timeout=RESULT_TIMEOUT)  # all four call at the same moment
                handle = client.start(f"{uid}.inc", i, run_id=f"{uid}-{i}")
                return handle.result(timeout=RESULT_TIMEOUT)

            results = await asyncio.gather(*(asyncio.to_thread(job, i) for i in range(4)))
            count = await asyncio.to_thread(client.count_runs)
        finally:
            await asyncio.to_thread(client.close)
    assert results == [1, 2, 3, 4]
    assert len(threads) == 4
    assert count == 4


async def test_a_closed_sync_client_refuses_calls_and_closes_once(url: str, uid: str):
    def use() -> None:
        with SyncClient(url) as client:
            assert client.get_run(f"{uid}-none") is None
        client.close()  # idempotent: the `with` closed it already
        with pytest.raises(RuntimeError, match="closed"):
            client.get_run(f"{uid}-none")

    await asyncio.to_thread(use)
    # its loop thread is gone (as is every other sync client's of this suite: each closes)
    assert "durably-sync-client" not in {t.name for t in threading.enumerate()}
