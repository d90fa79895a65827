"""Connection strategies of the SQL store, one per backend (`connector_for`).

SQLite allows ONE writer per database: every write of a process goes through one dedicated
connection (`SqliteConnector`); single statements are pipelined on it, transactions take it
exclusively, other processes wait on `busy_timeout`. Reads use the pool (WAL readers never
block the writer). Prebuilt statements run in one aiosqlite call (`FastStatements`).
PostgreSQL uses the pool for everything (`PoolConnector`).

Store code runs `work(session)` callbacks; a `Session` executes statements on one connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import StaticPool

from durably._store.sql.dialect import SQLITE_PRAGMAS, SqlDialect

T = TypeVar("T")
Work = Callable[["Session"], Awaitable[T]]
Params = dict[str, Any] | None


# ------------------------------------------------------------------ sessions


class Session:
    """Runs statements on one connection through SQLAlchemy (`AsyncConnection.execute`).

    `fetch` returns all rows (SELECT or `… RETURNING`), `execute` the affected-row count,
    `executemany` runs one statement over many parameter sets (one driver call).
    """

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn

    async def fetch(self, stmt: sa.Executable, params: Params = None) -> Sequence[Sequence[Any]]:
        return (await self.conn.execute(stmt, params)).all()

    async def execute(self, stmt: sa.Executable, params: Params = None) -> int:
        return int((await self.conn.execute(stmt, params)).rowcount)

    async def executemany(self, stmt: sa.Executable, params: list[dict[str, Any]]) -> None:
        await self.conn.execute(stmt, params)

    async def sql(self, text: str) -> None:
        await self.conn.exec_driver_sql(text)


class _Compiled:
    __slots__ = ("defaults", "names", "processors", "sql")

    def __init__(
        self,
        sql: str,
        names: Sequence[str],
        defaults: dict[str, Any],
        processors: dict[str, Callable[[Any], Any]],
    ) -> None:
        self.sql = sql
        self.names = tuple(names)
        self.defaults = defaults
        # SQLAlchemy's bind processors (e.g. `to_float` for REAL), applied like it would.
        self.processors = processors

    def args(self, params: dict[str, Any] | None) -> list[Any]:
        values = params or {}
        defaults = self.defaults
        out = [values[n] if n in values else defaults[n] for n in self.names]
        if self.processors:
            for i, name in enumerate(self.names):
                proc = self.processors.get(name)
                if proc is not None and out[i] is not None:
                    out[i] = proc(out[i])
        return out


class FastStatements:
    """SQLite fast path for the store's prebuilt statements.

    SQLAlchemy's aiosqlite adapter spends four thread hops per statement (cursor, execute,
    fetch, close). For statements the store builds once (`register`), we compile them once per
    parameter-key set with SQLAlchemy and run the SQL text directly on the aiosqlite
    connection SQLAlchemy hands out: ONE hop (`execute` / `execute_fetchall` /
    `executemany`). A statement that needs SQLAlchemy at execution time (expanding IN lists,
    bind processors) is detected at compile time and keeps the regular path, as do dynamic
    statements (list filters) that are never registered.
    """

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._registered: dict[int, sa.Executable] = {}
        self._cache: dict[tuple[int, tuple[str, ...], bool], _Compiled | None] = {}

    def register(self, *stmts: sa.Executable | None) -> None:
        for stmt in stmts:
            if stmt is not None:
                self._registered[id(stmt)] = stmt

    def compiled(
        self, stmt: sa.Executable, params: dict[str, Any] | None, many: bool = False
    ) -> _Compiled | None:
        if id(stmt) not in self._registered:
            return None
        keys = tuple(sorted(params)) if params else ()
        cache_key = (id(stmt), keys, many)
        try:
            return self._cache[cache_key]
        except KeyError:
            pass
        compiled: Any = stmt.compile(  # type: ignore[attr-defined]
            dialect=self._dialect, column_keys=list(keys), for_executemany=many
        )
        entry: _Compiled | None = None
        names = compiled.positiontup
        processors: Any = getattr(compiled, "_bind_processors", None)
        eligible = (
            names is not None
            and isinstance(processors, Mapping)
            and "POSTCOMPILE" not in compiled.string
            and not compiled.literal_execute_params
            and not compiled.post_compile_params
        )
        if eligible:
            entry = _Compiled(compiled.string, names, dict(compiled.params), dict(processors))
        self._cache[cache_key] = entry
        return entry


def _wrap_dbapi_error(sql: str, args: Any, error: Exception) -> Exception:
    return sa.exc.DBAPIError.instance(sql, args, error, sqlite3.Error)


class SqliteSession(Session):
    """`Session` whose registered statements run in one aiosqlite call (see FastStatements)."""

    def __init__(self, conn: AsyncConnection, raw: Any, fast: FastStatements) -> None:
        super().__init__(conn)
        self._raw = raw
        self._fast = fast
        # The SQLAlchemy path is not safe for concurrent use of one AsyncConnection; the
        # one-call fast path is (aiosqlite queues calls on its thread).
        self._sa_lock = asyncio.Lock()

    async def fetch(self, stmt: sa.Executable, params: Params = None) -> Sequence[Sequence[Any]]:
        entry = self._fast.compiled(stmt, params)
        if entry is None:
            async with self._sa_lock:
                return await super().fetch(stmt, params)
        args = entry.args(params)
        try:
            rows: Sequence[Sequence[Any]] = await self._raw.execute_fetchall(entry.sql, args)
        except sqlite3.Error as error:
            raise _wrap_dbapi_error(entry.sql, args, error) from error
        return rows

    async def execute(self, stmt: sa.Executable, params: Params = None) -> int:
        entry = self._fast.compiled(stmt, params)
        if entry is None:
            async with self._sa_lock:
                return await super().execute(stmt, params)
        args = entry.args(params)
        try:
            # DML without RETURNING: the statement runs to completion in the worker thread,
            # so dropping the cursor here touches no SQLite state.
            cursor = await self._raw.execute(entry.sql, args)
        except sqlite3.Error as error:
            raise _wrap_dbapi_error(entry.sql, args, error) from error
        return int(cursor.rowcount)

    async def executemany(self, stmt: sa.Executable, params: list[dict[str, Any]]) -> None:
        entry = self._fast.compiled(stmt, params[0], many=True) if params else None
        if entry is None:
            async with self._sa_lock:
                await super().executemany(stmt, params)
            return
        rows = [entry.args(p) for p in params]
        try:
            await self._raw.executemany(entry.sql, rows)
        except sqlite3.Error as error:
            raise _wrap_dbapi_error(entry.sql, rows, error) from error

    async def sql(self, text: str) -> None:
        try:
            # fetch in the worker thread: statements that return a row (PRAGMA) finish there
            await self._raw.execute_fetchall(text)
        except sqlite3.Error as error:
            raise _wrap_dbapi_error(text, (), error) from error


# ------------------------------------------------------------------ connection strategies


class Connector:
    """How the store obtains connections. `work` runs with a `Session`; with `tx=True` the
    whole of `work` is one transaction (rolled back if it raises)."""

    def register(self, *stmts: sa.Executable | None) -> None:
        """Statements built once by the store (eligible for a driver fast path)."""

    async def read(self, work: Work[T], *, point: bool = False) -> T:
        """`point=True`: a small indexed read (one statement) that may share the writer."""
        raise NotImplementedError

    async def write(self, work: Work[T], *, tx: bool = False) -> T:
        raise NotImplementedError

    async def close(self) -> None:
        return None


class _Gate:
    """FIFO shared/exclusive gate for the SQLite writer connection.

    Single autocommitted statements take it SHARED: several can be queued on the aiosqlite
    connection at once (its worker thread runs them back to back, in order), which pipelines
    the thread hops of concurrent writers. A multi-statement transaction takes it EXCLUSIVE,
    so no foreign statement can land between its BEGIN and COMMIT. Waiters are served in
    arrival order (consecutive shared waiters together), so transactions never starve.
    Only used from shielded tasks, so a waiter is never cancelled.
    """

    def __init__(self) -> None:
        self._shared = 0
        self._exclusive = False
        self._waiters: deque[tuple[bool, asyncio.Future[None]]] = deque()

    async def acquire(self, exclusive: bool) -> None:
        if not self._waiters and not self._exclusive and (not exclusive or not self._shared):
            if exclusive:
                self._exclusive = True
            else:
                self._shared += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((exclusive, future))
        await future

    def release(self, exclusive: bool) -> None:
        if exclusive:
            self._exclusive = False
        else:
            self._shared -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and not self._exclusive:
            exclusive, future = self._waiters[0]
            if exclusive:
                if self._shared:
                    return
                self._waiters.popleft()
                self._exclusive = True
                future.set_result(None)
                return
            self._waiters.popleft()
            self._shared += 1
            future.set_result(None)


class SqliteConnector(Connector):
    """One dedicated writer connection per store; SQLite allows a single writer.

    The writer runs in DBAPI autocommit mode: a single statement commits by itself (and
    concurrent single statements are pipelined on the connection, see `_Gate`);
    multi-statement work is wrapped in `BEGIN IMMEDIATE` … `COMMIT` under the exclusive gate
    (the write lock is taken up front, so a concurrent process waits on `busy_timeout` instead
    of failing with a deadlock between two deferred transactions). Writer work is shielded
    from cancellation: a cancelled caller never leaves the shared connection
    mid-transaction (its statement still completes).

    Point reads (`read(point=True)`: one small indexed statement) share the writer the same
    way; scans and list queries use the engine's pool (WAL readers do not block the writer).
    An in-memory database's single `StaticPool` connection is the writer for everything.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._gate = _Gate()
        self._open_lock = asyncio.Lock()
        self._writer_session: SqliteSession | None = None
        self._shared = isinstance(engine.sync_engine.pool, StaticPool)
        self._fast = FastStatements(engine.dialect)

    def register(self, *stmts: sa.Executable | None) -> None:
        self._fast.register(*stmts)

    async def _session(self, conn: AsyncConnection) -> SqliteSession:
        raw = (await conn.get_raw_connection()).driver_connection
        return SqliteSession(conn, raw, self._fast)

    @staticmethod
    def _usable(session: SqliteSession | None) -> bool:
        return session is not None and not session.conn.closed and not session.conn.invalidated

    async def _writer(self) -> SqliteSession:
        session = self._writer_session
        if session is not None and self._usable(session):
            return session
        async with self._open_lock:
            session = self._writer_session
            if session is not None and self._usable(session):
                return session
            if session is not None:
                await self._discard()
            conn = await self._engine.connect()
            try:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                session = await self._session(conn)
                for pragma in SQLITE_PRAGMAS:
                    await session.sql(pragma)
            except BaseException:
                with suppress(Exception):
                    await conn.close()
                raise
            self._writer_session = session
            return session

    async def _discard(self) -> None:
        session, self._writer_session = self._writer_session, None
        if session is not None:
            with suppress(Exception):
                await session.conn.invalidate()
            with suppress(Exception):
                await session.conn.close()

    async def _single(self, work: Work[T]) -> T:
        await self._gate.acquire(exclusive=False)
        try:
            session = await self._writer()
            try:
                return await work(session)
            except BaseException:
                if session.conn.invalidated and session is self._writer_session:
                    await self._discard()
                raise
        finally:
            self._gate.release(exclusive=False)

    async def _transaction(self, work: Work[T]) -> T:
        await self._gate.acquire(exclusive=True)
        try:
            session = await self._writer()
            await session.sql("BEGIN IMMEDIATE")
            try:
                result = await work(session)
                await session.sql("COMMIT")
            except BaseException:
                try:
                    await session.sql("ROLLBACK")
                except BaseException:
                    await self._discard()
                raise
            return result
        finally:
            self._gate.release(exclusive=True)

    async def write(self, work: Work[T], *, tx: bool = False) -> T:
        """`tx=False` work must be ONE statement (it may be pipelined with others)."""
        return await asyncio.shield(self._transaction(work) if tx else self._single(work))

    async def read(self, work: Work[T], *, point: bool = False) -> T:
        # Point reads are pipelined on the writer connection like single writes: one thread,
        # no pool round trip, and they see every write this process has made. Scans and list
        # queries use the pool, so a long read never holds up the writer.
        if self._shared or point:
            return await self.write(work, tx=False)
        async with self._engine.connect() as conn:
            return await work(await self._session(conn))

    async def close(self) -> None:
        await self._gate.acquire(exclusive=True)
        try:
            session, self._writer_session = self._writer_session, None
            if session is not None:
                with suppress(Exception):
                    await session.conn.close()
        finally:
            self._gate.release(exclusive=True)


class PoolConnector(Connector):
    """PostgreSQL: pooled connections; single statements in autocommit, `tx` work in
    `engine.begin()`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    async def read(self, work: Work[T], *, point: bool = False) -> T:
        async with self._autocommit.connect() as conn:
            return await work(Session(conn))

    async def write(self, work: Work[T], *, tx: bool = False) -> T:
        if tx:
            async with self._engine.begin() as conn:
                return await work(Session(conn))
        async with self._autocommit.connect() as conn:
            return await work(Session(conn))


def connector_for(dialect: SqlDialect, engine: AsyncEngine) -> Connector:
    if dialect.is_sqlite:
        return SqliteConnector(engine)
    return PoolConnector(engine)


__all__ = [
    "Connector",
    "FastStatements",
    "PoolConnector",
    "Session",
    "SqliteConnector",
    "SqliteSession",
    "connector_for",
]
