"""StateStore conformance suite, run against every first-party store.

The suite is split by area into the `test_conformance_*.py` modules; shared models and
helpers live in `support.py`. Each test takes the `store` fixture below, parametrized over
`memory` (InMemoryStateStore), `sqlite` (SqlStateStore on a temporary file) and `postgres`
(SqlStateStore on a fresh PostgreSQL schema per test; skipped when PostgreSQL is unreachable
unless `DURABLY_REQUIRE_SERVICES=1`, see tests/pg_support.py). Test-hook
checks that only the in-memory store exposes (read counters) are named `test_memory_*`.

`test_codec.py` runs a representative subset of the suite again through `CodecStateStore`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from durably import InMemoryStateStore
from tests.pg_support import fresh_schema, schema_url


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield InMemoryStateStore()
        return
    from durably._store.sql import SqlStateStore

    if request.param == "sqlite":
        sql = SqlStateStore.from_url(f"sqlite:///{tmp_path}/conf.db")
        await sql.ensure_schema()
        try:
            yield sql
        finally:
            await sql.close()
        return
    async with fresh_schema(create=False) as schema:
        sql = SqlStateStore.from_url(schema_url(schema))
        await sql.ensure_schema()  # creates the schema, then migrates it
        try:
            yield sql
        finally:
            await sql.close()
