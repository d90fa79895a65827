"""The transport suite (`durably.testing.conformance.TransportSuite`) on every transport
durably has: the in-process reference (`InMemoryTransport`), Redis (`RedisTransport`, under
a key prefix of the test's own, deleted afterwards) and SQL (`SqlTransport` on PostgreSQL,
with a table prefix of the test's own, dropped afterwards). Redis and PostgreSQL are skipped
when unreachable, a failure under `DURABLY_REQUIRE_SERVICES=1`.

The cases themselves live in the package, so a third-party transport runs exactly these.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from durably.testing.conformance import TransportSuite
from durably.transports import InMemoryTransport, RedisTransport, SqlTransport, Transport
from tests.pg_support import PG_URL, require_pg
from tests.remote.redis_support import REDIS_URL, delete_prefix, require_redis
from tests.remote.sql_support import drop_tables


class TestInMemoryTransport(TransportSuite):
    @pytest.fixture
    async def transport(self) -> AsyncIterator[Transport]:
        yield InMemoryTransport()


class TestRedisTransport(TransportSuite):
    @pytest.fixture
    async def transport(self) -> AsyncIterator[Transport]:
        await require_redis()
        prefix = f"dtest-{uuid.uuid4().hex[:10]}"
        try:
            yield RedisTransport(REDIS_URL, prefix=prefix)
        finally:
            await delete_prefix(REDIS_URL, prefix)


class TestSqlTransport(TransportSuite):
    @pytest.fixture
    async def transport(self) -> AsyncIterator[Transport]:
        await require_pg()
        prefix = f"t{uuid.uuid4().hex[:12]}"
        try:
            yield SqlTransport(PG_URL, prefix=prefix, poll_ms=50, pool_size=2)
        finally:
            await drop_tables(prefix)
