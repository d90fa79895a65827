"""The engine on the PostgreSQL store: `Engine(store="postgresql://…?schema=…")`,
`Engine(store=<AsyncEngine>)`, statements per step, and two engines on one schema."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any

import durably
from durably import WorkflowCtx
from durably._store.sql.dialect import create_engine
from tests.pg_support import pg_schema, pg_url

__all__ = ["pg_schema", "pg_url"]  # fixtures

N = 40
_ids = itertools.count()


def _workflow() -> tuple[Any, Any]:
    uid = f"pg{next(_ids)}-{uuid.uuid4().hex[:6]}"

    @durably.step(f"{uid}.inc")
    async def inc(x: int) -> int:
        return x + 1

    @durably.workflow(f"{uid}.seq")
    async def seq(ctx: WorkflowCtx, n: int) -> int:
        x = 0
        for _ in range(n):
            x = await ctx.step(inc, x)
        return x

    @durably.workflow(f"{uid}.waits")
    async def waits(ctx: WorkflowCtx, token: str) -> int:
        got: int = await ctx.wait_for_signal(token)
        return got + 1

    return seq, waits


async def test_engine_on_a_postgresql_url_at_most_two_statements_per_step(pg_url: str) -> None:
    seq, _ = _workflow()
    async with durably.Engine(store=pg_url, workflows=[seq], timer_poll_ms=60_000) as engine:
        await asyncio.sleep(0.2)  # the boot poll pass is not part of the run's cost
        before = engine.store.statement_count  # type: ignore[attr-defined]
        assert await engine.execute(seq, N, run_id="hot", timeout=30) == N
        statements = engine.store.statement_count - before  # type: ignore[attr-defined]
    # N checkpoint writes + create, claim, running, settle, the result read (+ wake-ups)
    print(f"PG statements for {N} steps: {statements}")
    assert statements <= 2 * N, statements
    assert statements <= N + 8, statements


async def test_engine_on_a_caller_owned_async_engine(pg_schema: str) -> None:
    from tests.pg_support import schema_url

    sa_engine = create_engine(schema_url(pg_schema))
    seq, _ = _workflow()
    try:
        async with durably.Engine(store=sa_engine, workflows=[seq]) as engine:
            assert await engine.execute(seq, 5, run_id="owned", timeout=30) == 5
        async with sa_engine.connect() as conn:  # still open: the caller owns it
            from sqlalchemy import text

            count = await conn.execute(text("SELECT count(*) FROM durable_step_checkpoints"))
            assert count.scalar_one() == 5
    finally:
        await sa_engine.dispose()


async def test_two_engines_on_one_schema(pg_url: str) -> None:
    """An API engine (drive=False) starts runs a worker engine executes; a signal sent by
    the API engine reaches the run waiting in the worker within milliseconds (wake bus)."""
    seq, waits = _workflow()
    async with (
        durably.Engine(store=pg_url, workflows=[seq, waits], timer_poll_ms=5_000) as worker,
        durably.Engine(
            store=pg_url, workflows=[seq, waits], drive=False, timer_poll_ms=5_000
        ) as api,
    ):
        handles = [await api.start(seq, 3, run_id=f"r{i}") for i in range(10)]
        results = await asyncio.gather(*(h.result(timeout=20) for h in handles))
        assert results == [3] * 10
        runs = [await worker.store.get_run(f"r{i}") for i in range(10)]
        assert all(r is not None and r.status == "completed" for r in runs)

        waiting = await api.start(waits, "go-token", run_id="w")
        deadline = time.monotonic() + 10
        while (run := await api.store.get_run("w")) is None or run.status != "suspended":
            assert time.monotonic() < deadline, run
            await asyncio.sleep(0.01)
        sent = time.perf_counter()
        await api.signal("go-token", 41)
        assert await waiting.result(timeout=10) == 42
        assert time.perf_counter() - sent < 2.0  # far below the 5 s poll: woken, not polled
