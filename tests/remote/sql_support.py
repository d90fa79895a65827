"""Shared pieces of the SQL transport tests: a table prefix per test, a recording sink, raw rows.

Import `prefix_fixture` and `db_fixture` into a test module for the `prefix` and `db`
fixtures. Every test gets its own prefix (`t<hex>`), so its `<prefix>_transport_*` tables, trigger
functions and NOTIFY channels are its own on the shared `test` database; they are dropped
afterwards. Rows are written and read with plain asyncpg (`tests.pg_support.connect`), as an
SDK worker or an operator would, never through the transport under test.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from durably._core.wire import RemoteTask, StepResult
from durably.transports import SqlTransport
from tests.pg_support import PG_URL, connect, require_pg


def now_ms() -> int:
    return int(time.time() * 1000)


async def drop_tables(prefix: str) -> None:
    conn = await connect()
    try:
        for table in ("tasks", "results"):
            await conn.execute(f'DROP TABLE IF EXISTS "{prefix}_transport_{table}" CASCADE')
            await conn.execute(f'DROP FUNCTION IF EXISTS "{prefix}_transport_{table}_notify"()')
    finally:
        await conn.close()


@pytest.fixture(name="prefix")
async def prefix_fixture() -> AsyncIterator[str]:
    """A table prefix of this test's own; its tables are dropped afterwards."""
    await require_pg()
    name = f"t{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        await drop_tables(name)


@pytest.fixture(name="db")
async def db_fixture() -> AsyncIterator[Any]:
    """A plain asyncpg connection for arranging and inspecting rows."""
    await require_pg()
    conn = await connect()
    try:
        yield conn
    finally:
        await conn.close()


def transport(prefix: str, **options: Any) -> SqlTransport:
    options.setdefault("poll_ms", 50)
    return SqlTransport(PG_URL, prefix=prefix, **options)


async def create_tables(prefix: str) -> None:
    """The transport's tables (as a first `SqlTransport` would create them)."""
    t = transport(prefix)
    await t.open()
    await t.close()


def task(run_id: str, seq: int, name: str, value: Any = None, **fields: Any) -> RemoteTask:
    return RemoteTask(
        run_id=run_id,
        seq=seq,
        name=name,
        step_id=f"{run_id}:{seq}",
        group=fields.pop("group", name),
        input=value,
        attempt=fields.pop("attempt", 1),
        **fields,
    )


class RecordingSink:
    """A ResultSink that records each delivered batch; `check` runs inside each delivery
    (before the transport may delete anything) and may raise to refuse the batch."""

    max_payload_bytes = 4 * 1024 * 1024  # the engine's default

    def __init__(self, check: Callable[[Sequence[StepResult]], Awaitable[None]] | None = None):
        self.batches: list[list[StepResult]] = []
        self.check = check
        self._changed = asyncio.Event()

    @property
    def results(self) -> list[StepResult]:
        return [result for batch in self.batches for result in batch]

    async def step_results(self, results: Sequence[StepResult]) -> None:
        try:
            if self.check is not None:
                await self.check(results)
            self.batches.append(list(results))
        finally:
            self._changed.set()

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[StepResult]:
        """The first `count` results, waiting up to `timeout` seconds for them."""
        async with asyncio.timeout(timeout):
            while len(self.results) < count:
                self._changed.clear()
                await self._changed.wait()
        return self.results


async def insert_result(db: Any, prefix: str, step_id: str, **columns: Any) -> None:
    """A result row as a worker writes it (`output`/`error` given as Python values become
    JSON text; `raw_output`/`raw_error` are written verbatim)."""
    run_id, _, seq = step_id.rpartition(":")
    output = columns.get("raw_output", _json(columns.get("output")))
    error = columns.get("raw_error", _json(columns.get("error")))
    await db.execute(
        f'INSERT INTO "{prefix}_transport_results" (step_id, run_id, seq, status, output, '
        "error, started_at, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        step_id,
        columns.get("run_id", run_id),
        int(columns.get("seq", seq)),
        columns.get("status", "completed"),
        output,
        error,
        columns.get("started_at"),
        columns.get("created_at", now_ms()),
    )


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


async def rows(db: Any, prefix: str, table: str) -> list[dict[str, Any]]:
    found = await db.fetch(f'SELECT * FROM "{prefix}_transport_{table}" ORDER BY step_id')
    return [dict(row) for row in found]


async def eventually(
    probe: Callable[[], Awaitable[bool]], timeout: float = 10.0, every: float = 0.02
) -> None:
    """Wait until `probe()` is true (fails the test after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while not await probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(every)
