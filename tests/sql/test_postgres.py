"""PostgreSQL specifics of the SQL store: options, schemas, round trips, reconnection, claims
across engines. Every test runs on its own fresh schema (tests/pg_support.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import deque
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

from durably._core.models import RunQuery, SignalWaiter
from durably._store.sql import SqlStateStore
from durably._store.sql.dialect import create_engine, normalize_url
from durably._store.sql.pg import split_url, wake_channel
from tests.pg_support import PG_URL, connect, fresh_schema, pg_schema, pg_url, schema_url
from tests.store.support import pickup, take_buffered, take_waiter, try_lock

from .conftest import at, make_cp, make_run

__all__ = ["pg_schema", "pg_url"]  # fixtures


async def _show(store: SqlStateStore, *settings: str) -> list[str]:
    async with store.engine.connect() as conn:
        return [(await conn.execute(sa.text(f"SHOW {name}"))).scalar_one() for name in settings]


# ------------------------------------------------------------------ options


def test_url_options_are_parsed_and_removed() -> None:
    url = sa.engine.make_url(
        "postgresql+asyncpg://u@h/db?schema=s1&pool_size=3&max_overflow=0&pool_pre_ping=true"
        "&statement_timeout=1500&connect_timeout=4&command_timeout=7.5&ssl=prefer"
    )
    rest, opts = split_url(url)
    assert dict(rest.query) == {"ssl": "prefer"}  # the driver's own parameters stay
    assert (opts.schema, opts.pool_size, opts.max_overflow, opts.pool_pre_ping) == (
        "s1",
        3,
        0,
        True,
    )
    assert (opts.statement_timeout, opts.connect_timeout, opts.command_timeout) == (1500, 4, 7.5)
    with pytest.raises(ValueError, match="schema name"):
        split_url(sa.engine.make_url("postgresql://u@h/db?schema=bad-name"))
    with pytest.raises(ValueError, match="pool_size"):
        split_url(sa.engine.make_url("postgresql://u@h/db?pool_size=many"))
    with pytest.raises(TypeError, match="PostgreSQL-only"):
        create_engine("sqlite://", schema="x")
    assert wake_channel("abc") == "durable_wake_abc"
    assert len(wake_channel("s" * 63)) <= 63


async def test_options_reach_the_pool_and_the_server(pg_schema: str) -> None:
    url = schema_url(pg_schema, pool_size=2, max_overflow=1, statement_timeout=1500)
    store = SqlStateStore.from_url(url, connect_timeout=4, application_name="durably_opts")
    try:
        pool: Any = store.engine.sync_engine.pool
        assert (pool.size(), pool._max_overflow) == (2, 1)
        assert store.schema == pg_schema
        shown = await _show(store, "search_path", "statement_timeout", "application_name")
        assert shown == [f'"{pg_schema}"', "1500ms", "durably_opts"]
        assert "schema" not in store.engine.url.query  # never handed to asyncpg
    finally:
        await store.close()
    # keywords win over the URL
    store = SqlStateStore.from_url(schema_url(pg_schema, pool_size=2), pool_size=4)
    try:
        assert store.engine.sync_engine.pool.size() == 4  # type: ignore[attr-defined]
    finally:
        await store.close()


async def test_statement_timeout_cancels_a_long_statement(pg_url: str) -> None:
    store = SqlStateStore.from_url(pg_url, statement_timeout=200)
    try:
        async with store.engine.connect() as conn:
            with pytest.raises(DBAPIError, match="statement timeout"):
                await conn.execute(sa.text("SELECT pg_sleep(2)"))
        await store.ensure_schema()  # the pool is healthy afterwards
        await store.create_run(make_run())
        assert await store.get_run("r1") is not None
    finally:
        await store.close()


async def test_schemas_isolate_stores_on_one_database() -> None:
    async with fresh_schema(create=False) as one, fresh_schema(create=False) as two:
        a = SqlStateStore.from_url(schema_url(one))
        b = SqlStateStore.from_url(schema_url(two))
        try:
            await a.ensure_schema()
            await b.ensure_schema()
            await a.create_run(make_run("only-in-a", status="pending"))
            await b.create_run(make_run("only-in-b", status="pending"))
            assert [r.id for r in await pickup(a, 10)] == ["only-in-a"]
            assert [r.id for r in await b.claim_pending_runs("x", 10, 0, 10)] == ["only-in-b"]
            assert await a.get_run("only-in-b") is None
        finally:
            await a.close()
            await b.close()


async def test_a_caller_engine_with_its_own_search_path(pg_schema: str) -> None:
    """`Engine(store=<AsyncEngine>)` path: the store uses whatever schema the engine's
    connections are configured for; the caller keeps (and disposes) the engine."""
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(
        normalize_url(PG_URL),  # a plain SQLAlchemy engine, none of durably's options
        connect_args={"server_settings": {"search_path": pg_schema}},
    )
    store = SqlStateStore(engine)
    try:
        assert store.schema is None
        await store.ensure_schema()
        await store.create_run(make_run())
        bus = store.wake_bus()
        assert bus is not None
        await bus.publish("ready", "r1")  # resolves current_schema() once
        assert bus.channel == wake_channel(pg_schema)  # type: ignore[attr-defined]
    finally:
        await store.close()
    conn = await connect()
    try:
        assert await conn.fetchval(f'SELECT id FROM "{pg_schema}".durable_workflow_runs') == "r1"
    finally:
        await conn.close()
    async with engine.connect() as c:  # still usable: the caller owns it
        assert (await c.execute(sa.text("SELECT 1"))).scalar_one() == 1
    await engine.dispose()


# ------------------------------------------------------------------ round trips


class _RoundTrips:
    """Counts asyncpg calls that each cost one network round trip."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import asyncpg
        from asyncpg.prepared_stmt import PreparedStatement

        self.calls: list[str] = []
        for owner, name in (
            (PreparedStatement, "fetch"),
            (PreparedStatement, "executemany"),
            (asyncpg.Connection, "prepare"),
            (asyncpg.Connection, "execute"),
            (asyncpg.Connection, "executemany"),
            (asyncpg.Connection, "fetch"),
            (asyncpg.Connection, "fetchrow"),
            (asyncpg.transaction.Transaction, "start"),
            (asyncpg.transaction.Transaction, "commit"),
            (asyncpg.transaction.Transaction, "rollback"),
        ):
            monkeypatch.setattr(owner, name, self._spy(getattr(owner, name), name))

    def _spy(self, real: Any, name: str) -> Any:
        async def spy(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return await real(*args, **kwargs)

        return spy


async def test_hot_paths_take_one_round_trip(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Autocommitted prebuilt statements, prepared once per connection: one Bind/Execute
    round trip per call (a one-connection pool makes the warm-up deterministic)."""
    store = SqlStateStore.from_url(schema_url(pg_schema, pool_size=1, max_overflow=0))
    await store.ensure_schema()

    def cases() -> list[tuple[str, Any]]:
        return [
            ("create_run", store.create_run(make_run(f"r{len(seen)}", status="pending"))),
            ("save_checkpoint", store.save_checkpoint(make_cp(status="pending"))),
            ("get_run", store.get_run("r1")),
            ("get_checkpoint", store.get_checkpoint("r1", 0)),
            ("update_run", store.update_run("r1", {"status": "pending", "wake_at": 5})),
            (
                "update_run_if_status",
                store.update_run_if_status("r1", {"status": "pending"}, ["pending"]),
            ),
            ("save_checkpoint_if_pending", store.save_checkpoint_if_pending(make_cp())),
            ("claim_run", store.claim_run("r1", "A", 10, 0)),
            ("claim_pending_runs", store.claim_pending_runs("A", 10, 10, 5)),
            ("renew_run_locks", store.renew_run_locks("A", 20)),
            ("list_checkpoints", store.list_checkpoints("r1")),
            ("list_due_timers", store.list_due_timers(10, "default", 5)),
            ("peek_buffered_signals", store.peek_buffered_signals("t", 5)),
            ("remove_signal_waiter", store.remove_signal_waiter(SignalWaiter("t", "r1", 0))),
        ]

    try:
        seen: list[str] = []
        for _, coro in cases():  # warm-up: prepares every statement on the one connection
            await coro
            seen.append("")
        pool: Any = store._cx.pool  # type: ignore[attr-defined]
        (conn,) = pool._idle  # the one connection
        prepared = len(conn._stmt_cache)
        spy = _RoundTrips(monkeypatch)
        for name, coro in cases():
            spy.calls.clear()
            before = store.statement_count
            await coro
            seen.append("")
            assert spy.calls in (["fetch"], ["execute"]), (name, spy.calls)
            assert store.statement_count - before == 1, name
        assert len(conn._stmt_cache) == prepared  # nothing was prepared again
        assert pool._idle == [conn]
    finally:
        await store.close()


# ------------------------------------------------------------------ reconnection


async def _terminate(application_name: str) -> int:
    conn = await connect()
    try:
        killed: int = await conn.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = $1 AND pid <> pg_backend_pid()",
            application_name,
        )
    finally:
        await conn.close()
    return killed


async def test_server_closed_connections_are_replaced_without_errors(pg_schema: str) -> None:
    name = f"durably_{uuid.uuid4().hex[:8]}"
    store = SqlStateStore.from_url(schema_url(pg_schema, application_name=name))
    try:
        await store.ensure_schema()
        await asyncio.gather(*(store.create_run(make_run(f"r{i}")) for i in range(8)))
        assert await _terminate(name) >= 1
        await asyncio.sleep(0.1)  # asyncpg notices the closed sockets on the event loop
        # idle pooled connections the server closed are replaced at checkout: no error
        found = await asyncio.gather(*(store.get_run(f"r{i}") for i in range(8)))
        assert all(run is not None for run in found)
    finally:
        await store.close()


async def test_an_in_flight_statement_fails_clearly_and_the_next_call_reconnects(
    pg_schema: str,
) -> None:
    name = f"durably_{uuid.uuid4().hex[:8]}"
    store = SqlStateStore.from_url(schema_url(pg_schema, application_name=name))
    try:
        await store.ensure_schema()
        await store.create_run(make_run())

        async def slow() -> None:  # a statement on the store's own connections
            await store._runner.read_all(sa.select(sa.func.pg_sleep(5)))

        task = asyncio.create_task(slow())
        await asyncio.sleep(0.3)
        assert await _terminate(name) >= 1
        with pytest.raises(DBAPIError) as caught:
            await task
        assert caught.value.connection_invalidated
        assert "terminating connection" in str(caught.value)
        run = await store.get_run("r1")  # the next call reconnects
        assert run is not None
        await store.update_run("r1", {"status": "completed"})
    finally:
        await store.close()


# ------------------------------------------------------------------ many engines, one schema


async def test_claimers_in_two_stores_share_the_backlog_without_overlap(pg_url: str) -> None:
    first = SqlStateStore.from_url(pg_url)
    second = SqlStateStore.from_url(pg_url)
    try:
        await first.ensure_schema()
        await second.ensure_schema()
        total = 200
        for start in range(0, total, 50):
            await asyncio.gather(
                *(
                    first.create_run(make_run(f"r{i:03d}", status="pending", created_at=at(i)))
                    for i in range(start, start + 50)
                )
            )
        won: list[tuple[str, str]] = []

        async def worker(store: SqlStateStore, owner: str) -> None:
            while claimed := await store.claim_pending_runs(owner, 10**12, 0, 7):
                won.extend((run.id, owner) for run in claimed)

        await asyncio.gather(
            *(worker(first, f"a{n}") for n in range(4)),
            *(worker(second, f"b{n}") for n in range(4)),
        )
        ids = [run_id for run_id, _ in won]
        assert len(ids) == len(set(ids)) == total
        assert {owner[0] for _, owner in won} == {"a", "b"}  # both stores got work
        rows = {r.id: r.locked_by for r in await first.list_runs(RunQuery(status="pending"))}
        assert rows == dict(won)
    finally:
        await first.close()
        await second.close()


async def test_concurrent_leases_and_takes_across_pool_connections(pg_url: str) -> None:
    from durably import SignalWaiter

    store = SqlStateStore.from_url(pg_url)
    try:
        await store.ensure_schema()
        await store.create_run(make_run())
        results = await asyncio.gather(
            *(try_lock(store, "r1", f"owner-{i}", 5_000, 1_000) for i in range(30))
        )
        assert results.count(True) == 1
        await store.put_signal_waiter(SignalWaiter("tok", "r1", 0))
        for n in range(20):
            await store.buffer_signal("buf", n)
        waiters = await asyncio.gather(*(take_waiter(store, "tok") for _ in range(20)))
        assert sum(w is not None for w in waiters) == 1
        taken = await asyncio.gather(*(take_buffered(store, "buf") for _ in range(25)))
        assert sorted(t.payload for t in taken if t is not None) == list(range(20))
    finally:
        await store.close()


# ------------------------------------------------------------------ the asyncpg pool


def _pool(store: SqlStateStore) -> Any:
    return store._cx.pool  # type: ignore[attr-defined]


async def _sleep(store: SqlStateStore, seconds: float) -> None:
    await store._runner.read_all(sa.select(sa.func.pg_sleep(seconds)))


async def test_the_pool_is_bounded_and_keeps_pool_size_idle(pg_schema: str) -> None:
    store = SqlStateStore.from_url(schema_url(pg_schema, pool_size=2, max_overflow=1))
    try:
        pool = _pool(store)
        assert (pool.max_size, pool.keep) == (3, 2)
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, pool.size)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        started = time.perf_counter()
        await asyncio.gather(*(_sleep(store, 0.1) for _ in range(9)))
        elapsed = time.perf_counter() - started
        watcher.cancel()
        assert peak == 3  # never more than pool_size + max_overflow
        assert elapsed >= 0.28  # 9 statements of 0.1 s, three at a time
        assert pool.size == len(pool._idle) == 2  # the overflow one was closed
    finally:
        await store.close()
    assert pool.size == 0


async def test_waiting_for_a_connection_times_out_clearly(pg_schema: str) -> None:
    url = schema_url(pg_schema, pool_size=1, max_overflow=0, pool_timeout=0.2)
    store = SqlStateStore.from_url(url)
    try:
        await store.ensure_schema()
        busy = asyncio.create_task(_sleep(store, 1))
        await asyncio.sleep(0.1)
        with pytest.raises(TimeoutError, match=r"no free PostgreSQL connection within 0\.2 s"):
            await store.get_run("r1")
        # a cancelled waiter leaves nothing behind
        waiter = asyncio.create_task(store.get_run("r1"))
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await busy
        assert _pool(store)._waiters == deque()
        assert await store.get_run("r1") is None
    finally:
        await store.close()


async def test_a_statement_cancelled_mid_flight_discards_its_connection(pg_url: str) -> None:
    store = SqlStateStore.from_url(pg_url, pool_size=1, max_overflow=0)
    try:
        await store.ensure_schema()
        await store.create_run(make_run())
        pool = _pool(store)
        (first,) = pool._idle
        task = asyncio.create_task(_sleep(store, 5))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.size == 0 and first.is_closed()
        run = await store.get_run("r1")  # a new connection
        assert run is not None and pool._idle and pool._idle[0] is not first
    finally:
        await store.close()


async def test_recycle_and_pre_ping(pg_url: str) -> None:
    recycling = SqlStateStore.from_url(pg_url, pool_recycle=0)
    pinging = SqlStateStore.from_url(pg_url, pool_pre_ping=True, application_name="durably_ping")
    try:
        await recycling.ensure_schema()
        await recycling.create_run(make_run())
        assert await recycling.get_run("r1") is not None
        assert _pool(recycling)._idle == []  # too old at once: closed when released
        assert await pinging.get_run("r1") is not None
        assert await _terminate("durably_ping") == 1
        assert await pinging.get_run("r1") is not None  # the ping found it dead
    finally:
        await recycling.close()
        await pinging.close()
    with pytest.raises(sa.exc.ResourceClosedError):
        await recycling.get_run("r1")


# ------------------------------------------------------------------ grouped checkpoint writes


async def test_concurrent_checkpoint_writes_share_round_trips(pg_url: str) -> None:
    from durably._store.sql import rows

    store = SqlStateStore.from_url(pg_url)
    try:
        await store.ensure_schema()
        cx: Any = store._cx  # type: ignore[attr-defined]
        before = store.statement_count
        await asyncio.gather(*(store.save_checkpoint(make_cp(f"r{i}", i)) for i in range(200)))
        assert store.statement_count - before == 200  # statements, as a caller sees them
        assert cx.group_round_trips < 100  # round trips: grouped while one was in flight
        counted = await store._runner.read_all(
            sa.text("SELECT count(*) FROM durable_step_checkpoints")
        )
        assert counted[0][0] == 200

        # one bad row fails alone; its group-mates are written
        good = [rows.checkpoint_to_sql(make_cp("g", i)) for i in range(5)]
        bad = {**rows.checkpoint_to_sql(make_cp("g", 99)), "name": None}  # NOT NULL
        results = await asyncio.gather(
            *(cx.execute_idempotent(store._q.save_cp, p) for p in [*good[:2], bad, *good[2:]]),
            return_exceptions=True,
        )
        names = [type(r).__name__ for r in results]
        assert names == ["NoneType"] * 2 + ["IntegrityError"] + ["NoneType"] * 3
        assert [cp.seq for cp in await store.list_checkpoints("g")] == [0, 1, 2, 3, 4]

        # a cancelled caller's row is written all the same; close waits for it
        task = asyncio.create_task(store.save_checkpoint(make_cp("c", 0)))
        await asyncio.sleep(0)
        task.cancel()
    finally:
        await store.close()
    again = SqlStateStore.from_url(pg_url)
    try:
        assert await again.get_checkpoint("c", 0) is not None
    finally:
        await again.close()
