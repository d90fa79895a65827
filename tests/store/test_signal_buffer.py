"""The bounded signal buffer on the first-party stores, beyond the state-store suite's cases
(`durably.testing.conformance.state_store.signal_buffer`): payloads at rest behind a codec,
concurrent senders against a cap, and the upgrade of rows buffered before the bounds.

The `subject` tests run on memory, SQLite and PostgreSQL, and on memory and SQLite behind a
visible payload codec, each store on a controllable clock.
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
