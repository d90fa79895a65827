"""StateStore conformance: the bounded signal buffer (TTL, per-token and per-namespace caps;
the contract is written on `durably._store.protocol.StateStore`).

Every test runs on memory, SQLite and PostgreSQL, and on memory and SQLite behind the payload
codec (`CodecStateStore`), each store on a controllable clock: expiry is judged by the
store's clock.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from durably import CodecStateStore, InMemoryStateStore
from durably._core.models import BufferedSignal, now_utc
from tests.pg_support import connect, fresh_schema, schema_url
from tests.store.support import take_buffered

HOUR = 3_600_000
BIG = 1_000_000  # a cap nobody reaches in these tests


class _Clock:
    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return now_utc() + self.offset

    def advance(self, **delta: float) -> None:
        self.offset += timedelta(**delta)


class _ReversingCodec:
    """A visible codec: the stored form is `{"enc": <reversed JSON text>}`."""

    def encode(self, value: Any) -> Any:
        return {"enc": json.dumps(value)[::-1]}

    def decode(self, value: Any) -> Any:
        return json.loads(value["enc"][::-1])


@dataclass
class Subject:
    store: Any
    clock: _Clock
    kind: str

    @property
    def encoded(self) -> bool:
        return self.kind.endswith("codec")

    async def bounded(
        self,
        token: str,
        payload: Any = 1,
        *,
        ttl_ms: int = HOUR,
        per_token: int = BIG,
        per_namespace: int = BIG,
    ) -> Any:
        return await self.store.buffer_signal_bounded(
            token, payload, ttl_ms=ttl_ms, per_token=per_token, per_namespace=per_namespace
        )

    async def tokens(self, prefix: str | None = None) -> list[str]:
        rows = await self.store.list_buffered_signals(prefix=prefix, limit=1000, offset=0)
        return [row.token for row in rows]


@pytest.fixture(params=["memory", "sqlite", "postgres", "memory-codec", "sqlite-codec"])
async def subject(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Subject]:
    kind: str = request.param
    clock = _Clock()

    def wrap(store: Any) -> Any:
        return CodecStateStore(store, _ReversingCodec()) if kind.endswith("codec") else store

    if kind.startswith("memory"):
        yield Subject(wrap(InMemoryStateStore(clock=clock)), clock, kind)
        return
    from durably._store.sql import SqlStateStore

    if kind.startswith("sqlite"):
        sql = SqlStateStore.from_url(f"sqlite:///{tmp_path}/buffer.db", clock=clock)
        await sql.ensure_schema()
        try:
            yield Subject(wrap(sql), clock, kind)
        finally:
            await sql.close()
        return
    async with fresh_schema(create=False) as schema:
        sql = SqlStateStore.from_url(schema_url(schema), clock=clock)
        await sql.ensure_schema()
        try:
            yield Subject(sql, clock, kind)
        finally:
            await sql.close()


# ------------------------------------------------------------------ caps


async def test_bounded_buffer_is_fifo_and_round_trips_payloads(subject: Subject) -> None:
    for payload in ({"n": 1}, None, [3, "é"], 2.5):
        assert await subject.bounded("tok", payload) is None
    store = subject.store
    assert await take_buffered(store, "tok") == BufferedSignal({"n": 1})
    hit = await take_buffered(store, "tok")
    assert hit is not None and hit.payload is None  # a null payload is still a hit
    assert await take_buffered(store, "tok") == BufferedSignal([3, "é"])
    assert await take_buffered(store, "tok") == BufferedSignal(2.5)
    assert await take_buffered(store, "tok") is None


async def test_per_token_cap_refuses_and_stores_nothing(subject: Subject) -> None:
    assert await subject.bounded("ns:a", "a1", per_token=2) is None
    assert await subject.bounded("ns:a", "a2", per_token=2) is None
    assert await subject.bounded("ns:a", "REFUSED", per_token=2) == "token"
    assert await subject.tokens() == ["ns:a", "ns:a"]
    assert await subject.bounded("ns:b", "b1", per_token=2) is None  # another token: room
    store = subject.store
    assert await take_buffered(store, "ns:a") == BufferedSignal("a1")
    assert await take_buffered(store, "ns:a") == BufferedSignal("a2")
    assert await take_buffered(store, "ns:a") is None
    assert await subject.bounded("ns:a", "a3", per_token=2) is None  # taken rows free room


async def test_per_namespace_cap_counts_the_text_before_the_first_colon(
    subject: Subject,
) -> None:
    # "acme", "acme:1" and "acme:2:x" share the namespace "acme"; "acme-2" and "acmex:1"
    # are namespaces of their own.
    for token in ("acme", "acme:1", "acme:2:x"):
        assert await subject.bounded(token, per_namespace=3) is None
    assert await subject.bounded("acme:3", "REFUSED", per_namespace=3) == "namespace"
    assert await subject.bounded("acme", "REFUSED", per_namespace=3) == "namespace"
    assert await subject.bounded("acme-2", per_namespace=3) is None
    assert await subject.bounded("acmex:1", per_namespace=3) is None
    assert await subject.store.count_buffered_signals() == 5
    assert await subject.store.count_buffered_signals(prefix="acme:3") == 0


async def test_the_token_cap_is_reported_before_the_namespace_cap(subject: Subject) -> None:
    assert await subject.bounded("x:1", per_token=1, per_namespace=1) is None
    assert await subject.bounded("x:1", per_token=1, per_namespace=1) == "token"
    assert await subject.bounded("x:2", per_token=1, per_namespace=1) == "namespace"


async def test_engine_records_are_not_capped_but_count_in_their_namespace(
    subject: Subject,
) -> None:
    for _ in range(3):
        await subject.store.buffer_signal("child:c1", {"ok": True})  # the engine's own
    assert await subject.bounded("child:c2", per_namespace=3) == "namespace"
    assert await subject.store.count_buffered_signals(prefix="child:") == 3


# ------------------------------------------------------------------ expiry


async def test_expired_rows_are_never_taken_nor_counted_and_purge_removes_them(
    subject: Subject,
) -> None:
    store = subject.store
    assert await subject.bounded("t", "old", ttl_ms=HOUR, per_token=1) is None
    await store.buffer_signal("child:k", "engine record")  # never expires
    [row] = await store.list_buffered_signals(prefix="t", limit=10, offset=0)
    assert row.buffered_at is not None and row.expires_at is not None
    assert row.expires_at - row.buffered_at == timedelta(hours=1)
    assert abs(row.buffered_at - subject.clock()) < timedelta(seconds=5)

    subject.clock.advance(hours=1)  # expires_at == now: expired
    assert await take_buffered(store, "t") is None
    assert await subject.bounded("t", "new", ttl_ms=HOUR, per_token=1) is None  # cap frees
    assert await subject.tokens() == ["t", "child:k", "t"]  # the expired row is still listed
    listed = await store.list_buffered_signals(prefix="t", limit=10, offset=0)
    # Stored times are whole milliseconds (rounded): read "now" one millisecond on.
    now = subject.clock() + timedelta(milliseconds=1)
    assert [r.is_expired(now) for r in listed] == [True, False]

    assert await store.purge_buffered_signals(expired_only=True) == 1
    assert await subject.tokens() == ["child:k", "t"]
    assert await take_buffered(store, "t") == BufferedSignal("new")
    subject.clock.advance(days=400)
    assert await take_buffered(store, "child:k") == BufferedSignal("engine record")


# ------------------------------------------------------------------ listing and counting


async def test_listing_pages_oldest_first_by_exact_prefix_without_payloads(
    subject: Subject,
) -> None:
    store = subject.store
    payloads = {"ord:1": {"card": "4242-secret"}, "ord:2": None, "Ord:3": "é", "ord_4": [1]}
    for token, payload in payloads.items():
        assert await subject.bounded(token, payload) is None
    await store.buffer_signal("child:c", True)

    rows = await store.list_buffered_signals(prefix=None, limit=1000, offset=0)
    assert [r.token for r in rows] == ["ord:1", "ord:2", "Ord:3", "ord_4", "child:c"]
    assert [r.expires_at is None for r in rows] == [False, False, False, False, True]
    assert all(r.buffered_at is not None for r in rows)
    if not subject.encoded:
        # bytes of the stored JSON text; a null payload stores nothing
        expected = [
            len(json.dumps(p, separators=(",", ":"), ensure_ascii=False).encode())
            for p in (*payloads.values(), True)
        ]
        expected[1] = 0
        assert [r.size_bytes for r in rows] == expected
        assert rows[2].size_bytes == 4  # '"é"': é is two bytes in UTF-8
    assert all("secret" not in json.dumps(r.to_json()) for r in rows)

    assert await subject.tokens("ord:") == ["ord:1", "ord:2"]  # exact, case-sensitive
    assert await subject.tokens("ord_") == ["ord_4"]  # `_` is no wildcard
    assert await subject.tokens("%") == []
    page = await store.list_buffered_signals(prefix=None, limit=2, offset=1)
    assert [r.token for r in page] == ["ord:2", "Ord:3"]
    assert await store.list_buffered_signals(prefix=None, limit=5, offset=10) == []
    assert await store.count_buffered_signals() == 5
    assert await store.count_buffered_signals(prefix="ord") == 3
    assert await store.count_buffered_signals(prefix="nothing") == 0


# ------------------------------------------------------------------ purging


async def test_purge_by_token_prefix_and_everything_keeps_engine_records(
    subject: Subject,
) -> None:
    store = subject.store
    for token in ("a:1", "a:1", "a:10", "a:2", "b:1"):
        await subject.bounded(token)
    await store.buffer_signal("child:k", 1)
    await store.buffer_signal("a:1", "engine-owned on a plain token")

    assert await store.purge_buffered_signals(token="a:1") == 2  # exactly that token
    assert await subject.tokens("a:") == ["a:10", "a:2", "a:1"]
    assert await store.purge_buffered_signals(prefix="a:1") == 1  # a:10
    assert await store.purge_buffered_signals(prefix="child:") == 0
    assert await store.purge_buffered_signals(expired_only=True) == 0
    assert await store.purge_buffered_signals() == 2  # a:2, b:1
    assert await subject.tokens() == ["child:k", "a:1"]
    assert await store.purge_buffered_signals(token="nobody") == 0


async def test_purge_expired_only_within_a_prefix(subject: Subject) -> None:
    store = subject.store
    await subject.bounded("p:old", ttl_ms=1000)
    await subject.bounded("q:old", ttl_ms=1000)
    subject.clock.advance(seconds=2)
    await subject.bounded("p:new", ttl_ms=1000)
    assert await store.purge_buffered_signals(prefix="p:", expired_only=True) == 1
    assert await subject.tokens() == ["q:old", "p:new"]
    assert await store.purge_buffered_signals(token="q:old", expired_only=True) == 1


# ------------------------------------------------------------------ codec


async def test_bounded_payloads_at_rest_are_encoded_exactly_with_a_codec(
    subject: Subject,
) -> None:
    raw_store = subject.store.inner if subject.encoded else subject.store
    await subject.bounded("tok", {"secret": 1})
    raw = await take_buffered(raw_store, "tok")
    at_rest = {"enc": json.dumps({"secret": 1})[::-1]} if subject.encoded else {"secret": 1}
    assert raw == BufferedSignal(at_rest)
    await subject.bounded("tok", {"secret": 2})
    assert await take_buffered(subject.store, "tok") == BufferedSignal({"secret": 2})


# ------------------------------------------------------------------ concurrency


async def test_concurrent_senders_overshoot_a_cap_by_less_than_their_number(
    subject: Subject,
) -> None:
    """Exact on memory and SQLite (one writer); on PostgreSQL each statement counts what was
    committed before it started, so the overshoot stays below the number of senders."""
    senders, cap = 16, 4
    results = await asyncio.gather(
        *(subject.bounded("hot:1", i, per_token=cap) for i in range(senders))
    )
    stored = await subject.store.count_buffered_signals(prefix="hot:1")
    assert stored == sum(1 for r in results if r is None)
    assert all(r in (None, "token") for r in results)
    if subject.kind == "postgres":
        assert cap <= stored < cap + senders - 1
    else:
        assert stored == cap


# ------------------------------------------------------------------ migration of old rows


async def _old_sqlite_database(path: Path) -> None:
    """A database at schema version 2 (before the bounds) with buffered rows."""
    from durably._store.sql.dialect import create_engine

    engine = create_engine(f"sqlite:///{path}")
    try:
        await upgrade_to(engine, 2)
    finally:
        await engine.dispose()
    with sqlite3.connect(path) as conn:
        conn.executemany(
            "INSERT INTO durable_buffered_signals (token, payload) VALUES (?, ?)",
            [("child:c1", '{"ok":true}'), ("planted", '"x"'), ("approve:1", None)],
        )


async def upgrade_to(engine: Any, version: int, schema: str | None = None) -> None:
    from durably._store.sql.connectors import connector_for
    from durably._store.sql.dialect import SqlDialect
    from durably._store.sql.migrations import apply_on

    dialect = SqlDialect(engine.dialect.name)
    connector = connector_for(dialect, engine)
    try:
        await connector.schema_transaction(
            lambda conn: apply_on(conn, dialect, to_version=version, schema=schema)
        )
    finally:
        await connector.close()


async def test_upgrading_gives_old_signals_a_ttl_and_keeps_engine_records(
    tmp_path: Path,
) -> None:
    from durably._store.sql import SqlStateStore

    path = tmp_path / "old.db"
    await _old_sqlite_database(path)
    store = SqlStateStore.from_url(f"sqlite:///{path}")
    try:
        await store.ensure_schema()
        rows = await store.list_buffered_signals(prefix=None, limit=10, offset=0)
        assert [r.token for r in rows] == ["child:c1", "planted", "approve:1"]
        assert rows[0].expires_at is None  # the engine's own completion record
        for row in rows[1:]:
            assert row.buffered_at is not None and row.expires_at is not None
            assert row.expires_at - row.buffered_at == timedelta(hours=24)
        assert (
            await store.buffer_signal_bounded(
                "approve:2", 1, ttl_ms=HOUR, per_token=5, per_namespace=1
            )
            == "namespace"
        )  # the migrated row counts in the namespace "approve"
        assert await take_buffered(store, "planted") == BufferedSignal("x")
        assert await take_buffered(store, "child:c1") == BufferedSignal({"ok": True})
    finally:
        await store.close()


async def test_upgrading_on_postgresql_gives_old_signals_a_ttl() -> None:
    from durably._store.sql import SqlStateStore
    from durably._store.sql.dialect import create_engine

    async with fresh_schema(create=False) as schema:
        url = schema_url(schema)
        engine = create_engine(url)
        try:
            await upgrade_to(engine, 2, schema)
        finally:
            await engine.dispose()
        conn = await connect()
        try:
            await conn.executemany(
                f'INSERT INTO "{schema}".durable_buffered_signals (token, payload) VALUES ($1, $2)',
                [("child:c1", '{"ok":true}'), ("planted", '"x"')],
            )
        finally:
            await conn.close()
        store = SqlStateStore.from_url(url)
        try:
            await store.ensure_schema()
            rows = await store.list_buffered_signals(prefix=None, limit=10, offset=0)
            assert [(r.token, r.expires_at is None) for r in rows] == [
                ("child:c1", True),
                ("planted", False),
            ]
            assert rows[1].expires_at is not None and rows[1].buffered_at is not None
            assert rows[1].expires_at - rows[1].buffered_at == timedelta(hours=24)
            assert (
                await store.buffer_signal_bounded(
                    "planted", 1, ttl_ms=HOUR, per_token=1, per_namespace=5
                )
                == "token"
            )
        finally:
            await store.close()
