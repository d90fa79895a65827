"""Closing an Engine or a Client on SQLite returns every connection it took: none is left
checked out of the pool for the garbage collector to find (SQLAlchemy warns "The garbage
collector is trying to clean up non-checked-in connection …" and drops it unclosed).

Each test opens, uses (start, result, signal, list, read) and closes, then checks the pool
the store used had nothing checked out, and that a full collection raises no SAWarning. A
caller that outlives the engine (a read after `close()`) is served, and leaves nothing
checked out either: the writer connection such a read reopened used to stay checked out.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import SAWarning

import durably
from durably import WorkflowCtx
from durably._store.sql import SqlStateStore


def _sql_store(store: Any) -> SqlStateStore:
    seen = store
    for _ in range(5):
        if isinstance(seen, SqlStateStore):
            return seen
        seen = next((v for v in vars(seen).values() if isinstance(v, SqlStateStore)), None)
    raise AssertionError(f"no SqlStateStore under {store!r}")


def _collected_sa_warnings() -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, SAWarning)]


@pytest.fixture
def wf(request: pytest.FixtureRequest) -> Any:
    uid = request.node.name.replace("[", "-").replace("]", "")

    @durably.step(f"{uid}.inc")
    def inc(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def flow(ctx: WorkflowCtx, x: int) -> int:
        y = await ctx.step(inc, x)
        got = await ctx.wait_for_signal(f"{ctx.run_id}-go")
        return y + int(got)

    return flow


async def test_an_engine_returns_every_connection_when_closed(tmp_path: Path, wf: Any) -> None:
    _collected_sa_warnings()  # what earlier tests left is not this test's
    engine = durably.Engine(store=f"sqlite:///{tmp_path / 'app.db'}", timer_poll_ms=20)
    async with engine:
        pool = _sql_store(engine.store).engine.pool
        handle = await engine.start(wf, 1, run_id="r1")
        await durably_wait_suspended(engine, "r1")
        await engine.signal("r1-go", 10)
        assert await handle.result(timeout=30) == 12
        assert [r.id for r in await engine.list_runs()] == ["r1"]
        assert (await engine.get_run("r1")) is not None
        assert len(await engine.list_checkpoints("r1")) == 2
    assert pool.checkedout() == 0, f"{pool.checkedout()} connections still checked out"
    del engine, handle
    assert _collected_sa_warnings() == []


async def test_a_client_returns_every_connection_when_closed(tmp_path: Path, wf: Any) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    _collected_sa_warnings()
    async with durably.Engine(store=url, timer_poll_ms=20) as worker:
        client = durably.Client(url)
        async with client:
            pool = _sql_store(client._store).engine.pool
            await client.start(wf, 1, run_id="r1")
            await durably_wait_suspended(worker, "r1")
            await client.signal("r1-go", 10)
            assert await client.result("r1", timeout=30) == 12
            assert [r.id for r in await client.list_runs()] == ["r1"]
            assert (await client.get_run("r1")) is not None
        assert pool.checkedout() == 0, f"{pool.checkedout()} connections still checked out"
        del client
    assert _collected_sa_warnings() == []


@pytest.mark.parametrize("opener", ["engine", "client"])
async def test_a_read_after_close_leaves_no_connection_checked_out(
    tmp_path: Path, wf: Any, opener: str
) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    _collected_sa_warnings()
    async with durably.Engine(store=url, timer_poll_ms=20) as worker:
        await worker.start(wf, 1, run_id="r1")
        await durably_wait_suspended(worker, "r1")
    api: Any = durably.Engine(store=url, drive=False) if opener == "engine" else durably.Client(url)
    async with api:
        assert (await api.get_run("r1")) is not None
    # a caller still holding the closed engine/client reads again
    late = await api.get_run("r1")
    assert late is not None and late.status == "suspended"
    assert [r.id for r in await api.list_runs()] == ["r1"]
    store = _sql_store(api.store if opener == "engine" else api._store)
    for _ in range(100):  # the writer loop closes its connection once its batch is done
        if store.engine.pool.checkedout() == 0:
            break
        await asyncio.sleep(0.01)
    assert store.engine.pool.checkedout() == 0, "a read after close left a connection out"
    del api, store
    assert _collected_sa_warnings() == []


async def durably_wait_suspended(engine: durably.Engine, run_id: str) -> None:
    run = await engine.get_handle(run_id).wait(timeout=30)
    assert run.status == "suspended", run
