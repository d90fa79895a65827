"""The first-party stores the store tests run on, and the `store` fixture over them.

`open_first_party(kind, tmp_path, clock)` opens a fresh, empty store of one kind: `memory`
(InMemoryStateStore), `sqlite` (SqlStateStore on a temporary file) or `postgres`
(SqlStateStore on a fresh PostgreSQL schema per test; skipped when PostgreSQL is unreachable
unless `DURABLY_REQUIRE_SERVICES=1`, see tests/pg_support.py). The `store` fixture is
parametrized over the three.

The state-store contract itself is `durably.testing.conformance.StateStoreSuite`;
`test_state_store_suite.py` runs it on the three stores, `test_codec.py` runs a
representative subset again through `CodecStateStore`. The files here hold what only the
first-party stores show: their round-trip counters (`test_round_trips.py`), SQL rows and
plans (`test_sql_specifics.py`), the codec and AES-GCM at rest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from durably import InMemoryStateStore
from tests.pg_support import fresh_schema, schema_url

FIRST_PARTY = ["memory", "sqlite", "postgres"]


@asynccontextmanager
async def open_first_party(
    kind: str, tmp_path: Path, clock: Callable[[], datetime] | None = None
) -> AsyncIterator[Any]:
    """`clock`: the time the store reads (the wall clock when None)."""
    if kind == "memory":
        yield InMemoryStateStore(clock=clock)
        return
    from durably._store.sql import SqlStateStore

    if kind == "sqlite":
        sql = SqlStateStore.from_url(f"sqlite:///{tmp_path}/conf.db", clock=clock)
        await sql.ensure_schema()
        try:
            yield sql
        finally:
            await sql.close()
        return
    async with fresh_schema(create=False) as schema:
        sql = SqlStateStore.from_url(schema_url(schema), clock=clock)
        await sql.ensure_schema()  # creates the schema, then migrates it
        try:
            yield sql
        finally:
            await sql.close()


@pytest.fixture(params=FIRST_PARTY)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    async with open_first_party(request.param, tmp_path) as opened:
        yield opened
