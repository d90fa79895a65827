"""PostgreSQL connection budgets on the real server: a store whose budget the server cannot
hold says so at open, a full server makes statements wait for the pool's own connections
instead of failing, and a lease release that finds no connection is retried — then, if it
still cannot run, logged at ERROR once and left to lapse.

The server's limit is simulated with a role's `CONNECTION LIMIT` (a role made for the test
and dropped after it): the shared server's settings are never changed."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from durably._store.sql import SqlStateStore
from tests.pg_support import PG_URL, connect, pg_schema, schema_url
from tests.store.support import make_run, try_lock

__all__ = ["pg_schema"]  # fixtures

Limited = Callable[[int], Awaitable[tuple[str, str]]]


@pytest.fixture
async def limited(pg_schema: str) -> AsyncIterator[Limited]:
    """`await limited(n)`: a new login role with CONNECTION LIMIT n owning this test's
    schema, and the store URL that connects as it."""
    roles: list[str] = []

    async def make(limit: int) -> tuple[str, str]:
        role = f"durably_t_role_{uuid.uuid4().hex[:10]}"
        conn = await connect()
        try:
            await conn.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT {limit}')
            await conn.execute(f'GRANT CREATE, CONNECT ON DATABASE test TO "{role}"')
            await conn.execute(f'ALTER SCHEMA "{pg_schema}" OWNER TO "{role}"')
        finally:
            await conn.close()
        roles.append(role)
        url = make_url(PG_URL).set(username=role).render_as_string(hide_password=False)
        return role, schema_url(pg_schema, url)

    yield make
    conn = await connect()
    try:
        for role in roles:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
            )
            await conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}" CASCADE')
            await conn.execute(f'DROP OWNED BY "{role}"')
            await conn.execute(f'DROP ROLE IF EXISTS "{role}"')
    finally:
        await conn.close()


async def _hold(role: str, n: int) -> list[Any]:
    """`n` plain connections of `role`: the room other processes would take."""
    return [await connect(user=role, patience=0) for _ in range(n)]


async def _sessions_of(role: str) -> int:
    conn = await connect()
    try:
        return int(
            await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE usename = $1", role)
        )
    finally:
        await conn.close()


async def _wait_sessions(role: str, n: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while await _sessions_of(role) != n:
        assert loop.time() < deadline, f"role {role} never had {n} sessions"
        await asyncio.sleep(0.05)


async def _terminate(role: str) -> None:
    conn = await connect()
    try:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role
        )
    finally:
        await conn.close()


async def _locked_by(pg_schema: str, run_id: str) -> str | None:
    conn = await connect()
    try:
        value = await conn.fetchval(
            f'SELECT locked_by FROM "{pg_schema}".durable_workflow_runs WHERE id = $1', run_id
        )
        return None if value is None else str(value)
    finally:
        await conn.close()


def _budget_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "has room for" in r.getMessage()
    ]


async def test_a_budget_the_server_cannot_hold_is_warned_about_at_open(
    limited: Limited, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durably")
    role, url = await limited(8)
    store = SqlStateStore.from_url(url)  # the default budget: 10 + 10 + 3
    try:
        await store.ensure_schema()
    finally:
        await store.close()
    [warning] = _budget_warnings(caplog)
    assert "up to 23" in warning and "CONNECTION LIMIT 8" in warning, warning
    assert f"role {role!r}" in warning

    caplog.clear()
    fits = SqlStateStore.from_url(url + "&pool_budget=6")
    try:
        await fits.ensure_schema()
    finally:
        await fits.close()
    assert _budget_warnings(caplog) == []

    # the same budget, with four of the role's eight connections taken by others
    others = await _hold(role, 4)
    try:
        crowded = SqlStateStore.from_url(url + "&pool_budget=6")
        try:
            await crowded.ensure_schema()
        finally:
            await crowded.close()
    finally:
        for conn in others:
            await conn.close()
    [warning] = _budget_warnings(caplog)
    assert "room for 4 more" in warning and "4 in use by others" in warning, warning


def test_pool_budget_sizes_the_pool_and_refuses_what_does_not_fit(pg_schema: str) -> None:
    from durably._store.sql.pgconn import PgConnector

    store = SqlStateStore.from_url(schema_url(pg_schema, pool_budget=8))
    cx = store._cx
    assert isinstance(cx, PgConnector)
    assert (cx.pool.max_size, cx.pool.keep, cx.budget()) == (5, 5, 8)
    with pytest.raises(ValueError, match="do not fit in pool_budget=8"):
        SqlStateStore.from_url(schema_url(pg_schema, pool_budget=8, pool_size=4, max_overflow=2))
    with pytest.raises(ValueError, match="leaves no connection"):
        SqlStateStore.from_url(schema_url(pg_schema, pool_budget=3))


async def test_a_full_server_makes_statements_wait_for_the_pools_own_connections(
    limited: Limited, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="durably")
    role, url = await limited(3)
    store = SqlStateStore.from_url(url)
    await store.ensure_schema()
    others = await _hold(role, 2)  # one connection of the role's three is left for the store
    try:
        found = await asyncio.gather(*(store.get_run(f"nope-{i}") for i in range(30)))
        assert found == [None] * 30
    finally:
        for conn in others:
            await conn.close()
        await store.close()
    full = [r for r in caplog.records if "has no room for another connection" in r.getMessage()]
    assert len(full) == 1 and full[0].levelno == logging.WARNING


async def _store_without_connections(
    role: str, url: str, pg_schema: str, run_id: str, held: int
) -> tuple[SqlStateStore, list[Any]]:
    """A store holding the lease of `run_id`, whose connections the server then closed, and
    `held` connections of the role taking the room they had."""
    store = SqlStateStore.from_url(url)
    await store.ensure_schema()
    await store.create_run(make_run(run_id, status="running"))
    assert await try_lock(store, run_id, "engine-1", 2**50, 0)
    assert await _locked_by(pg_schema, run_id) == "engine-1"
    await _terminate(role)
    await _wait_sessions(role, 0)
    return store, await _hold(role, held)


async def test_a_release_that_finds_no_connection_is_retried(
    limited: Limited, pg_schema: str
) -> None:
    role, url = await limited(2)
    store, others = await _store_without_connections(role, url, pg_schema, "r-retry", 2)
    try:
        release = asyncio.create_task(store.release_run_lock("r-retry"))
        await asyncio.sleep(0.3)  # the first attempts find the role's room taken
        assert not release.done()
        await others.pop().close()  # room for one connection again
        await asyncio.wait_for(release, 10)
        assert await _locked_by(pg_schema, "r-retry") is None
    finally:
        for conn in others:
            await conn.close()
        await store.close()


async def test_a_release_that_still_fails_is_logged_once_and_left_to_lapse(
    limited: Limited,
    pg_schema: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from durably._store.sql import leases  # (imported here: the module is new)

    monkeypatch.setattr(leases, "RELEASE_RETRY_DELAYS_S", (0.05, 0.1, 0.1))
    caplog.set_level(logging.INFO, logger="durably")
    role, url = await limited(2)
    store, others = await _store_without_connections(role, url, pg_schema, "r-lapse", 2)
    try:
        await asyncio.wait_for(store.release_run_lock("r-lapse"), 20)  # does not raise
    finally:
        for conn in others:
            await conn.close()
    try:
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1, [r.getMessage() for r in errors]
        text = errors[0].getMessage()
        assert "r-lapse" in text and "4 attempts" in text and "left to lapse" in text
        assert await _locked_by(pg_schema, "r-lapse") == "engine-1"  # lapses at its expiry
    finally:
        await store.close()
