"""Fixtures of the flow-control suite.

`open_world(kind)` builds admission backends on one shared world per test, for every
backend durably has: `local` (the in-process `LocalAdmission`), `postgres` (`PgAdmission`
on a fresh PostgreSQL schema; skipped when the server is unreachable unless
`DURABLY_REQUIRE_SERVICES=1`) and `redis` (`RedisAdmission` under a fresh key prefix on the
shared Redis server, deleted after the test; skipped likewise when Redis is unreachable).
The `world` fixture is parametrized over the three; `test_admission_suite.py` runs the
admission-backend suite (`durably.testing.conformance.AdmissionBackendSuite`) on them.

Every backend of one world reads the same `ManualClock`, so TTLs, windows and waiter pruning
are tested without sleeping.

`engines` builds engines (tests/engine_support.py's `EngineFactory`) on SQLite and
PostgreSQL, resident and classic.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest

from durably._core.admission import AdmissionBackend, LocalAdmission
from durably.testing.conformance import ManualClock
from tests.engine_support import EngineFactory
from tests.pg_support import fresh_schema, schema_url
from tests.remote.redis_support import REDIS_URL, delete_prefix, require_redis

_ids = itertools.count()

BACKENDS = ["local", "postgres", "redis"]


class AdmissionWorld:
    """Backends that share one admission state: `backend("A")` and `backend("B")` act for two
    processes (on `local` there is only one process, so they are the same backend)."""

    def __init__(self, kind: str, stack: AsyncExitStack, url: str | None) -> None:
        self.kind = kind
        self.clock = ManualClock()
        self._stack = stack
        self._url = url
        self._backends: dict[str, AdmissionBackend] = {}
        self._local: LocalAdmission | None = None
        # Redis only: every key of the world lives under it (`<prefix>:adm:…`).
        self.prefix = f"dtest-{uuid.uuid4().hex[:10]}-w"

    async def backend(self, owner: str = "A") -> AdmissionBackend:
        found = self._backends.get(owner)
        if found is not None:
            return found
        made: AdmissionBackend
        if self.kind == "local":
            if self._local is None:
                self._local = LocalAdmission(clock=self.clock)
            made = self._local
        elif self.kind == "redis":
            from durably._transport.redis_admission import RedisAdmission

            assert self._url is not None
            made = RedisAdmission(self._url, prefix=self.prefix, owner=owner, clock=self.clock)
            self._stack.push_async_callback(made.close)
        else:
            from durably._store.sql import SqlStateStore
            from durably._store.sql.admission import PgAdmission

            assert self._url is not None
            store = SqlStateStore.from_url(self._url)
            self._stack.push_async_callback(store.close)
            await store.ensure_schema()
            made = PgAdmission(store, owner=owner, clock=self.clock)
            self._stack.push_async_callback(made.close)
        self._backends[owner] = made
        return made


@asynccontextmanager
async def open_world(kind: str) -> AsyncIterator[AdmissionWorld]:
    async with AsyncExitStack() as stack:
        url: str | None = None
        if kind == "postgres":
            schema = await stack.enter_async_context(fresh_schema(create=False))
            url = schema_url(schema)
        if kind == "redis":
            await require_redis()
            url = REDIS_URL
        world = AdmissionWorld(kind, stack, url)
        if kind == "redis":
            # Registered before any backend, so it runs after they have closed.
            stack.push_async_callback(delete_prefix, REDIS_URL, world.prefix.removesuffix("-w"))
        yield world


@pytest.fixture(params=BACKENDS)
async def world(request: pytest.FixtureRequest) -> AsyncIterator[AdmissionWorld]:
    async with open_world(request.param) as opened:
        yield opened


# ------------------------------------------------------------------ engines


@pytest.fixture(
    params=[
        pytest.param(("sqlite", "hot"), id="sqlite-hot"),
        pytest.param(("sqlite", "replay"), id="sqlite-replay"),
        pytest.param(("postgres", "hot"), id="postgres-hot"),
        pytest.param(("postgres", "replay"), id="postgres-replay"),
    ]
)
async def engines(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EngineFactory]:
    """Engines on one store per test: SQLite (admission in-process) and PostgreSQL (admission
    fleet-wide in the store), each resident (`hot`) and classic (`replay`)."""
    store_kind, mode = request.param
    if store_kind != "postgres":
        yield EngineFactory(store_kind, mode, tmp_path)
        return
    async with fresh_schema(create=False) as schema:
        yield EngineFactory(store_kind, mode, tmp_path, pg_schema=schema)


@pytest.fixture
def uid() -> str:
    """A prefix unique to this test (decorators register into a process-global registry)."""
    return f"f{next(_ids)}-{uuid.uuid4().hex[:6]}"
