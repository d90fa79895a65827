"""PostgreSQL for the tests: reachability (skip, or fail under CI) and one fresh schema per test.

- `DURABLY_TEST_PG_URL` (default `postgresql://postgres@127.0.0.1:5432/test`) names the server.
- When it cannot be reached, tests that need it are skipped — unless
  `DURABLY_REQUIRE_SERVICES=1` (set by `.ci/run`), which turns that into a failure.
- `fresh_schema()` creates a uniquely named schema (`durably_t_<hex>`) and drops it (CASCADE)
  afterwards; `schema_url(schema)` is the URL whose `?schema=` makes a store, an `Engine(store=
  url)` or `SqlStateStore.from_url(url)` use it (tables, migrations lock and wake channel).

Use the `pg_schema` / `pg_url` fixtures (import them into a conftest:
`from tests.pg_support import pg_schema, pg_url  # noqa: F401`) or call `require_pg()` and
`fresh_schema()` directly.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
PG_URL = os.environ.get("DURABLY_TEST_PG_URL") or DEFAULT_PG_URL
SCHEMA_PREFIX = "durably_t_"

_unreachable: str | None = None
_checked = False


def services_required() -> bool:
    return os.environ.get("DURABLY_REQUIRE_SERVICES", "") not in ("", "0")


def _dsn() -> str:
    """`PG_URL` as asyncpg understands it (no SQLAlchemy driver suffix)."""
    scheme, sep, rest = PG_URL.partition("://")
    return f"postgresql{sep}{rest}" if scheme.startswith("postgres") else PG_URL


async def connect(*, patience: float = 15.0, **kwargs: Any) -> Any:
    """A plain asyncpg connection to the test server (for test setup and inspection).

    Retries for up to `patience` seconds while the server refuses connections or is starting
    up (another suite on this machine may be restarting it)."""
    import asyncpg

    timeout = kwargs.pop("timeout", 5)
    deadline = time.monotonic() + patience
    while True:
        try:
            return await asyncpg.connect(_dsn(), timeout=timeout, **kwargs)
        except (OSError, asyncpg.CannotConnectNowError, asyncpg.ConnectionDoesNotExistError):
            if time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.2)


async def require_pg() -> None:
    """Skip the calling test when PostgreSQL is unreachable (fail if services are required)."""
    global _unreachable, _checked
    if not _checked:
        _checked = True
        try:
            conn = await connect(timeout=3, patience=3)
        except ModuleNotFoundError as exc:
            _unreachable = f"asyncpg is not installed ({exc})"
        except Exception as exc:
            _unreachable = f"{type(exc).__name__}: {exc}"
        else:
            await conn.close()
    if _unreachable is None:
        return
    message = f"PostgreSQL at {PG_URL} is unreachable: {_unreachable}"
    if services_required():
        pytest.fail(f"{message} (DURABLY_REQUIRE_SERVICES=1: services are required)")
    pytest.skip(message)


def schema_url(schema: str, url: str = PG_URL, **options: Any) -> str:
    """`url` with `?schema=<schema>` (and any other durably option) in its query string."""
    query = "&".join(f"{k}={v}" for k, v in {"schema": schema, **options}.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


async def drop_schema(schema: str) -> None:
    conn = await connect()
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@asynccontextmanager
async def fresh_schema(*, create: bool = True) -> AsyncIterator[str]:
    """A new, uniquely named schema for one test, dropped afterwards. With `create=False` it
    is only named (the store's `ensure_schema()` creates it)."""
    await require_pg()
    schema = f"{SCHEMA_PREFIX}{uuid.uuid4().hex[:12]}"
    if create:
        conn = await connect()
        try:
            await conn.execute(f'CREATE SCHEMA "{schema}"')
        finally:
            await conn.close()
    try:
        yield schema
    finally:
        await drop_schema(schema)


@pytest.fixture
async def pg_schema() -> AsyncIterator[str]:
    """A fresh (empty, existing) schema, dropped after the test."""
    async with fresh_schema() as schema:
        yield schema


@pytest.fixture
def pg_url(pg_schema: str) -> str:
    """The test server's URL with `?schema=` naming this test's fresh schema."""
    return schema_url(pg_schema)


__all__ = [
    "PG_URL",
    "connect",
    "drop_schema",
    "fresh_schema",
    "pg_schema",
    "pg_url",
    "require_pg",
    "schema_url",
    "services_required",
]
