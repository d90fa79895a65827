"""The LISTEN/NOTIFY wake bus of the SQL store on PostgreSQL (`SqlStateStore.wake_bus()`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from durably._store.protocol import WakeBus
from durably._store.sql import SqlStateStore
from durably._store.sql.wakebus import PgWakeBus
from tests.pg_support import connect, fresh_schema, pg_schema, pg_url, schema_url

from .conftest import sqlite_url

__all__ = ["pg_schema", "pg_url"]  # fixtures


class Inbox:
    """A handler that records `(kind, run_id)` with arrival times and lets tests wait."""

    def __init__(self) -> None:
        self.got: list[tuple[str, str]] = []
        self.at: list[float] = []
        self._changed = asyncio.Event()

    def __call__(self, kind: str, run_id: str) -> None:
        self.got.append((kind, run_id))
        self.at.append(time.perf_counter())
        self._changed.set()

    async def wait_for(self, count: int, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.got) < count:
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"got {self.got}, wanted {count} message(s)")
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass


@pytest.fixture
async def stores(pg_url: str) -> AsyncIterator[tuple[SqlStateStore, SqlStateStore]]:
    """Two stores (two engines, as in two processes) on one schema."""
    one = SqlStateStore.from_url(pg_url)
    two = SqlStateStore.from_url(pg_url)
    await one.ensure_schema()
    try:
        yield one, two
    finally:
        await one.close()
        await two.close()


def bus_of(store: SqlStateStore) -> PgWakeBus:
    bus = store.wake_bus()
    assert isinstance(bus, PgWakeBus)
    return bus


async def test_two_buses_on_one_schema_see_each_others_messages(
    stores: tuple[SqlStateStore, SqlStateStore],
) -> None:
    one, two = stores
    bus_a, bus_b = bus_of(one), bus_of(two)
    inbox_a, inbox_b = Inbox(), Inbox()
    await bus_a.start(inbox_a)
    await bus_b.start(inbox_b)
    _: WakeBus = bus_a  # the protocol seam

    sent = time.perf_counter()
    before = one.statement_count
    await bus_a.publish("ready", "run-1")
    assert one.statement_count - before == 1  # SELECT pg_notify(...), counted
    await bus_b.publish("settled", "run:with:colons")
    await inbox_a.wait_for(2)
    await inbox_b.wait_for(2)
    expected = [("ready", "run-1"), ("settled", "run:with:colons")]
    assert inbox_a.got == expected  # its own message too
    assert inbox_b.got == expected
    latency_ms = (inbox_b.at[0] - sent) * 1000
    assert latency_ms < 250, latency_ms  # milliseconds in practice
    assert bus_a.delivered == 2 and bus_a.publish_failures == 0


async def test_publishes_of_one_loop_turn_share_one_notify(
    stores: tuple[SqlStateStore, SqlStateStore],
) -> None:
    """A burst (a wide fan's children settling together) costs one NOTIFY per kind and per
    ~7,000 bytes of ids, and every id still arrives, odd characters included."""
    one, two = stores
    bus_a, bus_b = bus_of(one), bus_of(two)
    inbox = Inbox()
    await bus_b.start(inbox)
    await bus_a.start(Inbox())
    ids = [f"fan.all.0.{i}" for i in range(1000)] + ['odd"id\\n:*', "[not-json"]
    before = one.statement_count
    await asyncio.gather(*(bus_a.publish("settled", run_id) for run_id in ids))
    await bus_a.publish("ready", "alone")
    sent = one.statement_count - before
    assert 2 <= sent <= 6, sent  # ~15 kB of ids in <= 7,000-byte payloads, plus "ready"
    await inbox.wait_for(len(ids) + 1)
    assert inbox.got == [("settled", run_id) for run_id in ids] + [("ready", "alone")]


async def test_other_schemas_do_not_cross_talk(pg_url: str) -> None:
    async with fresh_schema() as other:
        here = SqlStateStore.from_url(pg_url)
        there = SqlStateStore.from_url(schema_url(other))
        try:
            near, far = Inbox(), Inbox()
            bus_here, bus_there = bus_of(here), bus_of(there)
            await bus_here.start(near)
            await bus_there.start(far)
            assert bus_here.channel != bus_there.channel
            await bus_there.publish("ready", "theirs")
            await bus_here.publish("ready", "ours")
            await near.wait_for(1)
            await far.wait_for(1)
            await asyncio.sleep(0.05)
            assert near.got == [("ready", "ours")]
            assert far.got == [("ready", "theirs")]
        finally:
            await here.close()
            await there.close()


async def test_the_listener_survives_a_terminated_connection(
    stores: tuple[SqlStateStore, SqlStateStore],
) -> None:
    one, two = stores
    listener, publisher = bus_of(one), bus_of(two)
    inbox = Inbox()
    await listener.start(inbox)
    old_pid = listener.listener_pid
    assert old_pid is not None and listener.connects == 1
    for _ in range(2):  # twice in a row
        pid = listener.listener_pid
        conn = await connect()
        try:
            assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
        finally:
            await conn.close()
        deadline = time.monotonic() + 10
        while listener.listener_pid in (None, pid):
            assert time.monotonic() < deadline, "the listener did not reconnect"
            await asyncio.sleep(0.01)
    assert listener.connects == 3 and listener.listener_pid != old_pid
    await publisher.publish("ready", "after-drop")
    await inbox.wait_for(1)
    assert inbox.got == [("ready", "after-drop")]


async def test_close_stops_delivery_and_releases_the_connection(
    stores: tuple[SqlStateStore, SqlStateStore],
) -> None:
    one, two = stores
    closing, publisher = bus_of(one), bus_of(two)
    witness = bus_of(two)
    closed_inbox, witness_inbox = Inbox(), Inbox()
    await closing.start(closed_inbox)
    await witness.start(witness_inbox)
    pid = closing.listener_pid
    await closing.close()
    await closing.close()  # idempotent
    assert closing.listener_pid is None
    await publisher.publish("ready", "late")
    await witness_inbox.wait_for(1)
    await asyncio.sleep(0.05)
    assert closed_inbox.got == []
    conn = await connect()
    try:
        alive = await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)
    finally:
        await conn.close()
    assert alive == 0
    with pytest.raises(RuntimeError, match="closed"):
        await closing.start(closed_inbox)


async def test_store_close_closes_its_buses_and_a_failing_handler_is_contained(
    pg_url: str,
) -> None:
    store = SqlStateStore.from_url(pg_url)
    await store.ensure_schema()
    bus = bus_of(store)
    inbox = Inbox()

    def handler(kind: str, run_id: str) -> None:
        inbox(kind, run_id)
        if run_id == "boom":
            raise RuntimeError("handler bug")

    await bus.start(handler)
    await bus.publish("ready", "boom")
    await bus.publish("ready", "fine")
    await inbox.wait_for(2)
    assert [run_id for _, run_id in inbox.got] == ["boom", "fine"]
    await store.close()
    assert bus.listener_pid is None


async def test_publish_failures_are_counted_not_raised(pg_url: str) -> None:
    store = SqlStateStore.from_url(pg_url)
    bus = bus_of(store)

    async def broken(channel: str, payload: str) -> Any:
        raise ConnectionError("down")

    try:
        bus._notify = broken  # type: ignore[method-assign]
        await bus.publish("ready", "x")  # best effort: logged and counted
        assert bus.publish_failures == 1
    finally:
        await store.close()


async def test_sqlite_has_no_wake_bus(tmp_path: Path) -> None:
    store = SqlStateStore.from_url(sqlite_url(tmp_path / "w.db"))
    try:
        assert store.wake_bus() is None
    finally:
        await store.close()


async def test_a_silently_dead_listener_is_replaced_by_the_health_check(
    stores: tuple[SqlStateStore, SqlStateStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncpg

    from durably._store.sql import wakebus

    monkeypatch.setattr(wakebus, "HEALTH_INTERVAL_S", 0.05)
    monkeypatch.setattr(wakebus, "HEALTH_TIMEOUT_S", 0.1)
    one, two = stores
    listener, publisher = bus_of(one), bus_of(two)
    inbox = Inbox()
    await listener.start(inbox)
    stuck = listener._conn
    real_execute = asyncpg.Connection.execute

    async def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self is stuck:  # a half-open connection: the ping never comes back
            await asyncio.sleep(10)
        return await real_execute(self, *args, **kwargs)

    monkeypatch.setattr(asyncpg.Connection, "execute", execute)
    deadline = time.monotonic() + 5
    while listener.connects < 2:
        assert time.monotonic() < deadline, "the health check did not replace the listener"
        await asyncio.sleep(0.01)
    assert stuck.is_closed()
    await publisher.publish("ready", "healthy-again")
    await inbox.wait_for(1)
    assert inbox.got == [("ready", "healthy-again")]
