"""One live process per `instance_id` (`SupportsInstanceHold`).

An engine restarted with the same `instance_id` takes its previous life's leases back at
once — but only once that previous life is provably gone. The proof is a lock the operating
system or the database drops when its holder dies:

* PostgreSQL: a session-level advisory lock, held on a dedicated connection for the life of
  the engine (the server releases it when that session ends, e.g. when the process is killed);
* SQLite file: an exclusive `flock` on a file next to the database (the kernel releases it
  when the process dies);
* in-memory SQLite: a registry in this process.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
from contextlib import suppress
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from durably._store.sql import pg as _pg

_LOCAL_HOLDS: set[tuple[int, str]] = set()


class _PgHold:
    def __init__(self, conn: Any):
        self._conn = conn

    async def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with suppress(Exception):
                await conn.close()  # ending the session releases the advisory lock


class _FileHold:
    def __init__(self, fd: int):
        self._fd: int | None = fd

    async def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


class _LocalHold:
    def __init__(self, key: tuple[int, str]):
        self._key: tuple[int, str] | None = key

    async def release(self) -> None:
        key, self._key = self._key, None
        if key is not None:
            _LOCAL_HOLDS.discard(key)


async def hold_pg(engine: AsyncEngine, key: str) -> _PgHold | None:
    fairy = await _pg.connecting(engine, engine.raw_connection())
    conn: Any = fairy.driver_connection
    fairy.detach()  # ours for the engine's life: the pool opens another one in its place
    try:
        acquired = await conn.fetchval("SELECT pg_try_advisory_lock(hashtext($1))", key)
    except BaseException:
        with suppress(Exception):
            await conn.close()
        raise
    if not acquired:
        await conn.close()
        return None
    return _PgHold(conn)


async def hold_file(database: str, instance_id: str) -> _FileHold | None:
    digest = hashlib.sha1(instance_id.encode()).hexdigest()[:16]

    def lock() -> int | None:
        path = f"{os.path.abspath(database)}.instance-{digest}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd

    fd = await asyncio.to_thread(lock)
    return _FileHold(fd) if fd is not None else None


def hold_local(scope: object, instance_id: str) -> _LocalHold | None:
    key = (id(scope), instance_id)
    if key in _LOCAL_HOLDS:
        return None
    _LOCAL_HOLDS.add(key)
    return _LocalHold(key)
