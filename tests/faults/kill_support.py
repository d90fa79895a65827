"""What the SIGKILL tests of one process share: a store per test (a SQLite file, or a fresh
PostgreSQL schema) and killing a process that is still running."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.pg_support import fresh_schema, require_pg, schema_url


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL `proc` unless it already ended, and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


@asynccontextmanager
async def store_url(kind: str, tmp_path: Path, name: str) -> AsyncIterator[str]:
    """A store for one test: `tmp_path/<name>.db` on SQLite, or a fresh PostgreSQL schema
    (dropped afterwards; the test fails rather than skips when services are required)."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / f'{name}.db'}"
        return
    await require_pg()
    async with fresh_schema(create=False) as schema:
        yield schema_url(schema)
