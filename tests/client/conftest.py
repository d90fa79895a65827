"""Fixtures of the `durably.Client` suite: one store per test — the in-memory reference, an
SQLite file, or a fresh PostgreSQL schema — shared by a worker `Engine` and a `Client`."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from durably import InMemoryStateStore
from tests.pg_support import fresh_schema, schema_url

_ids = itertools.count()

# Small tuning so timers and leases react within tens of milliseconds.
FAST: dict[str, Any] = {"timer_poll_ms": 20, "lease_ms": 2000, "drain_timeout_ms": 2000}


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """What to pass as `store=` to both the worker engine and the client."""
    if request.param == "memory":
        yield InMemoryStateStore()
    elif request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'client.db'}"
    else:
        async with fresh_schema(create=False) as schema:
            yield schema_url(schema)


@pytest.fixture
def uid() -> str:
    """A prefix unique to this test, for workflow names and tokens (the decorators register
    into a process-global registry)."""
    return f"c{next(_ids)}-{uuid.uuid4().hex[:6]}"
