"""A PostgreSQL store that cannot be reached fails with a `StoreConnectionError` that names
host:port and what failed — never a bare driver error.

The unreachable servers are real sockets on 127.0.0.1: an asyncio server that accepts TCP and
never answers (the PostgreSQL handshake times out), one that accepts and hangs up at once, a
port nothing listens on, a host name that cannot resolve (`.invalid` never does), and the
real test server refusing an unknown role.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from durably import Engine, StoreConnectionError
from durably._core.errors import StoreConnectTimeoutError
from durably._store.sql import SqlStateStore
from tests.cli.support import durably as durably_cli
from tests.pg_support import PG_URL, pg_schema, pg_url, require_pg

__all__ = ["pg_schema", "pg_url"]  # fixtures

TIMEOUT_S = 0.5  # the connect_timeout the tests set: a timeout is reported within seconds


async def _serve(handler: object) -> AsyncIterator[int]:
    tasks: set[asyncio.Task[None]] = set()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await handler(writer)  # type: ignore[operator]
        finally:
            writer.close()
            tasks.discard(task)

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


@pytest.fixture
async def silent_port() -> AsyncIterator[int]:
    """A port that accepts TCP connections and never sends a byte."""

    async def never_answer(_writer: asyncio.StreamWriter) -> None:
        await asyncio.Event().wait()

    async for port in _serve(never_answer):
        yield port


@pytest.fixture
async def hang_up_port() -> AsyncIterator[int]:
    """A port that accepts TCP connections and closes them at once."""

    async def hang_up(writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()

    async for port in _serve(hang_up):
        yield port


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _url(port: int, *, host: str = "127.0.0.1", timeout: float | None = TIMEOUT_S) -> str:
    query = f"?connect_timeout={timeout}" if timeout is not None else ""
    return f"postgresql://app@{host}:{port}/x{query}"


async def _open_engine(url: str) -> BaseException:
    engine = Engine(url, workflows=[])
    try:
        with pytest.raises(StoreConnectionError) as caught:
            await engine.open()
    finally:
        await engine.close()
    return caught.value


async def test_a_server_that_never_answers_names_the_handshake_and_the_option(
    silent_port: int,
) -> None:
    started = time.monotonic()
    error = await _open_engine(_url(silent_port))
    assert time.monotonic() - started < 10
    message = str(error)
    assert isinstance(error, StoreConnectTimeoutError)
    assert isinstance(error, TimeoutError)  # code that caught the bare TimeoutError still does
    assert f"127.0.0.1:{silent_port}" in message
    assert "did not answer the PostgreSQL handshake within 0.5 s" in message
    assert "connect_timeout" in message
    assert (error.host, error.port) == ("127.0.0.1", silent_port)


async def test_the_default_timeout_is_named_too(silent_port: int) -> None:
    """Without connect_timeout in the URL the message gives the default it waited for."""
    store = SqlStateStore.from_url(_url(silent_port, timeout=None), connect_timeout=0.3)
    try:
        with pytest.raises(StoreConnectTimeoutError, match=r"within 0\.3 s.*connect_timeout"):
            await store.ensure_schema()
    finally:
        await store.close()


async def test_a_statement_on_a_fresh_pool_explains_its_connect_failure(
    silent_port: int,
) -> None:
    """Not only the schema check: every new connection of the store's pool."""
    store = SqlStateStore.from_url(_url(silent_port))
    try:
        with pytest.raises(StoreConnectTimeoutError, match=f"127.0.0.1:{silent_port}"):
            await store.get_run("r1")
    finally:
        await store.close()


async def test_a_refused_port_is_named(closed_port: int) -> None:
    message = str(await _open_engine(_url(closed_port)))
    assert f"127.0.0.1:{closed_port}" in message
    assert "connection refused" in message


async def test_a_server_that_hangs_up_is_named(hang_up_port: int) -> None:
    error = await _open_engine(_url(hang_up_port))
    assert f"127.0.0.1:{hang_up_port}" in str(error)
    assert "cannot connect to PostgreSQL" in str(error)


async def test_an_unknown_host_is_named() -> None:
    host = f"durably-{uuid.uuid4().hex[:8]}.invalid"
    message = str(await _open_engine(_url(5432, host=host)))
    assert f"{host}:5432" in message
    assert "could not be resolved" in message


async def test_a_login_the_server_refuses_gives_its_reason() -> None:
    await require_pg()
    role = f"nobody_{uuid.uuid4().hex[:8]}"
    tail = PG_URL.split("@", 1)[-1]
    message = str(await _open_engine(f"postgresql://{role}@{tail}"))
    assert f"user {role!r}" in message
    assert f'role "{role}" does not exist' in message
    assert "refused the connection" in message


async def test_a_statement_over_command_timeout_names_the_server_and_the_option(
    pg_url: str,
) -> None:
    """Connected, then no answer in time: asyncpg's own TimeoutError has no text either."""
    store = SqlStateStore.from_url(pg_url, command_timeout=0.3)
    try:
        await store.ensure_schema()
        with pytest.raises(TimeoutError) as caught:
            await store._runner.read_all(sa.select(sa.func.pg_sleep(3)))
        assert await store.get_run("r1") is None  # the store goes on working
    finally:
        await store.close()
    message = str(caught.value)
    assert PG_URL.split("@", 1)[-1].split("/")[0] in message
    assert "did not complete the statement within command_timeout (0.3 s)" in message


@pytest.mark.parametrize(
    "command", [["runs", "list"], ["db", "upgrade"]], ids=["runs-list", "db-upgrade"]
)
async def test_the_cli_reports_a_silent_server_clearly(
    silent_port: int, tmp_path: Path, command: list[str]
) -> None:
    # The CLI runs in a thread so this loop keeps serving the silent port meanwhile.
    result: subprocess.CompletedProcess[str] = await asyncio.to_thread(
        durably_cli, *command, "--store", _url(silent_port), cwd=tmp_path
    )
    assert result.returncode == 1, result
    assert f"127.0.0.1:{silent_port}" in result.stderr
    assert "PostgreSQL handshake within 0.5 s" in result.stderr
    assert "connect_timeout" in result.stderr
    assert "Traceback" not in result.stderr
