"""The PostgreSQL connection strategy of the SQL store (asyncpg): `PgConnector`.

SQLAlchemy's async execution path costs ~4x the CPU of the asyncpg call underneath it (the
greenlet hop, pool checkout events, the execution context, result wrapping). The store's
statements are few and fixed, so on PostgreSQL with asyncpg the store runs them on asyncpg
directly:

- `PgPool`: a bounded LIFO pool of asyncpg connections. Each one is opened through the
  engine's own SQLAlchemy pool (so every connect argument of the engine applies: host, SSL,
  `search_path`, `statement_timeout`, …) and then detached from it, ours until closed. At
  most `pool_size + max_overflow` connections (durably's options, or the engine's pool
  settings); `pool_size` idle ones stay open, an overflow one is closed when released with
  nobody waiting (under load it is handed straight to the next caller). A connection the
  server closed is replaced at checkout for free (`is_closed()`); `pool_pre_ping` adds a real
  ping; `pool_recycle` ages connections out.
- `PgStatements`: SQLAlchemy compiles each statement once per parameter-key set (prebuilt
  ones are cached; dynamic ones are compiled per call, IN lists expanded); asyncpg prepares
  each SQL text once per connection (its statement cache), so a prebuilt statement costs ONE
  Bind/Execute round trip.
- Single statements are autocommitted; `tx=True` work runs in `conn.transaction()`.
- Driver errors are raised as SQLAlchemy's (`IntegrityError`, `DBAPIError` with
  `connection_invalidated=True` when the connection died), like the SQLAlchemy path would.
  A connection that cannot be opened raises `StoreConnectionError` naming host:port and what
  failed (`pg.connecting`); asyncpg's text-less `TimeoutError` of an expired
  `command_timeout` is replaced by one that names the server and the option.

Migrations (`schema_transaction`) use the engine itself (`engine.begin()`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from durably._core.log_context import durably_logger
from durably._store.sql import pg as _pg
from durably._store.sql.compiled import FastStatements
from durably._store.sql.connection import Connector, Params, Session, Work

T = TypeVar("T")

_DEFAULT_POOL_TIMEOUT_S = 30.0
#: After the server refused a connection for lack of room, how long the pool makes do with
#: the connections it has before it tries to open another.
_FULL_BACKOFF_S = 1.0
#: SQLSTATE of "too many clients" / "too many connections for role|database".
_TOO_MANY_CONNECTIONS = "53300"

log = durably_logger("durably.store")


#: What the server has room for: its limit and reserve, the role's and the database's
#: CONNECTION LIMIT (-1: none), and the client connections counted against each.
_ROOM_SQL = """
SELECT current_setting('max_connections')::int,
       current_setting('superuser_reserved_connections')::int
         + coalesce(nullif(current_setting('reserved_connections', true), ''), '0')::int,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'),
       r.rolsuper, r.rolname, r.rolconnlimit,
       (SELECT count(*) FROM pg_stat_activity
         WHERE usename = current_user AND backend_type = 'client backend'),
       d.datname, d.datconnlimit,
       (SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND backend_type = 'client backend')
FROM pg_roles r, pg_database d
WHERE r.rolname = current_user AND d.datname = current_database()
"""


def _no_room(error: BaseException) -> bool:
    """The server refused a new connection because it is full (not unreachable, not a bad
    password): `max_connections`, a role's or a database's CONNECTION LIMIT."""
    driver = _pg.driver_error(error)
    return getattr(driver, "sqlstate", None) == _TOO_MANY_CONNECTIONS


# ------------------------------------------------------------------ statements


class PgStatements:
    """SQL text + positional arguments for asyncpg, compiled by SQLAlchemy."""

    def __init__(self, dialect: Dialect) -> None:
        self._dialect = dialect
        self._fast = FastStatements(dialect)

    def register(self, *stmts: sa.Executable | None) -> None:
        self._fast.register(*stmts)

    def one(self, stmt: sa.Executable, params: Params) -> tuple[str, Sequence[Any]]:
        entry = self._fast.compiled(stmt, params)
        if entry is not None:
            return entry.sql, entry.args(params)
        compiled: Any = stmt.compile(  # type: ignore[attr-defined]
            dialect=self._dialect, column_keys=sorted(params) if params else None
        )
        state = compiled.construct_expanded_state(params or None)
        args = list(state.positional_parameters)
        processors = state.processors
        if processors:
            for i, name in enumerate(state.positiontup or ()):
                proc = processors.get(name)
                if proc is not None and args[i] is not None:
                    args[i] = proc(args[i])
        return str(state.statement), args

    def many(self, stmt: sa.Executable, rows: list[dict[str, Any]]) -> tuple[str, list[Any]]:
        entry = self._fast.compiled(stmt, rows[0], many=True)
        if entry is not None:
            return entry.sql, [entry.args(row) for row in rows]
        out: list[Any] = []
        sql = ""
        for row in rows:  # (no prebuilt executemany needs this; kept for completeness)
            sql, args = self.one(stmt, row)
            out.append(args)
        return sql, out


#: A call whose connection turned out dead before anything was sent (see `_never_sent`) is
#: retried on another connection; nothing ran, so this is safe for writes too.
_ATTEMPTS = 3


def _never_sent(error: BaseException) -> bool:
    """asyncpg refused to start the operation on a connection the server was closing: it is
    still consuming the server's final error (`cannot switch to state …`), or already knows
    the connection is closed. Raised before a byte of the statement went out; a transaction
    begun on it earlier died uncommitted with the connection."""
    orig = error.__cause__ if isinstance(error, sa.exc.DBAPIError) else error
    if orig is None or not type(orig).__module__.startswith("asyncpg"):
        return False
    names = {cls.__name__ for cls in type(orig).__mro__}
    if "InternalClientError" in names:
        return "cannot switch to state" in str(orig)
    if "InterfaceError" in names:
        return "connection is closed" in str(orig)
    return False


def _rowcount(status: str) -> int:
    """`UPDATE 3`, `INSERT 0 1`, `DELETE 0`, `SELECT 1` → the count."""
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else -1


# ------------------------------------------------------------------ errors


class _Errors:
    """asyncpg exceptions → the SQLAlchemy exceptions the SQLAlchemy path raises."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._dbapi: Any = engine.dialect.loaded_dbapi

    def wrap(self, error: Exception, conn: Any, sql: str, args: Any) -> Exception:
        if isinstance(error, TimeoutError) and not str(error):
            return self._command_timeout()
        if isinstance(error, sa.exc.SQLAlchemyError | TimeoutError):
            return error
        dbapi = self._dbapi
        mapping: dict[type, Any] = getattr(dbapi, "_asyncpg_error_translate", {})
        translated: Any = None
        for cls in type(error).__mro__:
            if cls in mapping:
                message = error.args[0] if error.args else str(error)
                translated = mapping[cls](message, error)
                break
        dead = conn is None or conn.is_closed()
        if translated is None:
            if not (dead or isinstance(error, OSError | ConnectionError)):
                return error  # not a database error: as is
            translated = dbapi.InterfaceError(str(error) or type(error).__name__, error)
        wrapped: Exception = sa.exc.DBAPIError.instance(
            sql, args, translated, dbapi.Error, connection_invalidated=dead
        )
        wrapped.__cause__ = error
        return wrapped

    def _command_timeout(self) -> TimeoutError:
        """asyncpg's `command_timeout` expired: it raises a TimeoutError without any text,
        which says neither which server nor which limit."""
        host, port = _pg.connect_target(self._engine)
        opts = _pg.options_of(self._engine)
        seconds = opts.command_timeout if opts is not None else None
        limit = f"command_timeout ({seconds:g} s)" if seconds is not None else "command_timeout"
        return TimeoutError(
            f"PostgreSQL at {host}:{port} did not complete the statement within {limit}; "
            "asyncpg cancelled it. Raise ?command_timeout=SECONDS in the store URL (or leave "
            "it out) if statements may take longer, or look for what blocks the server"
        )


# ------------------------------------------------------------------ the pool


class PgPool:
    """A bounded LIFO pool of asyncpg connections detached from the engine's pool."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        max_size: int,
        keep: int,
        timeout: float,
        recycle: float | None,
        pre_ping: bool,
    ) -> None:
        self._engine = engine
        self.max_size = max(1, max_size)
        #: idle connections kept open (`pool_size`); more (`max_overflow`) are opened under
        #: load and closed when released with nobody waiting
        self.keep = max(1, min(keep, self.max_size))
        self._timeout = timeout
        self._recycle = recycle if recycle is not None and recycle >= 0 else None
        self._pre_ping = pre_ping
        self._idle: list[Any] = []
        self._born: dict[int, float] = {}
        self._waiters: deque[asyncio.Future[Any]] = deque()
        self.size = 0  # open connections, idle and in use
        self._closed = False
        #: until when (monotonic) no new connection is tried: the server refused one for
        #: lack of room, and asking again at once would only be refused again
        self._full_until = 0.0
        self._full_logged = False

    async def acquire(self) -> Any:
        while True:
            if self._closed:
                raise sa.exc.ResourceClosedError("the store is closed")
            while self._idle:
                conn = self._idle.pop()
                if self._usable(conn) and await self._alive(conn):
                    return conn
                self._drop(conn)
            if self.size < self.max_size and not self._server_full():
                self.size += 1
                try:
                    conn = await self._open()
                except BaseException as error:
                    self.size -= 1
                    self._wake_one()
                    if self.size == 0 or not _no_room(error):
                        raise
                    # The server has no room for another connection (max_connections, a
                    # role's or database's CONNECTION LIMIT): use the ones this pool has
                    # rather than fail the statement.
                    self._note_full(error)
                else:
                    self._full_until = 0.0
                    return conn
            conn = await self._wait()
            if conn is not None:
                return conn

    def _server_full(self) -> bool:
        return self.size > 0 and time.monotonic() < self._full_until

    def _note_full(self, error: BaseException) -> None:
        self._full_until = time.monotonic() + _FULL_BACKOFF_S
        if self._full_logged:
            return
        self._full_logged = True  # once per pool: an outage must be seen, not flood the log
        host, port = _pg.connect_target(self._engine)
        log.warning(
            "PostgreSQL at %s:%s has no room for another connection of this process (%s); "
            "it goes on with the %d it has, and statements wait for one of them (up to "
            "pool_timeout, %g s). The fleet's connection budgets exceed what the server "
            "allows: lower pool_budget on its processes, or raise max_connections / the "
            "role's CONNECTION LIMIT",
            host,
            port,
            _pg.driver_error(error) or error,
            self.size,
            self._timeout,
        )

    async def _wait(self) -> Any:
        """A connection handed over by `release`, or None to look again (one was dropped)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            async with asyncio.timeout(self._timeout):
                return await future
        except TimeoutError:
            raise TimeoutError(
                f"no free PostgreSQL connection within {self._timeout:g} s "
                f"({self.max_size} in use; raise pool_size/max_overflow or pool_timeout)"
            ) from None
        except BaseException:
            if future.done() and not future.cancelled() and future.result() is not None:
                self.release(future.result())  # handed over as we were cancelled
            elif not future.done():
                with suppress(ValueError):
                    self._waiters.remove(future)  # (a settled one was popped already)
            raise

    def release(self, conn: Any, *, discard: bool = False) -> None:
        if discard or self._closed or not self._usable(conn):
            self._drop(conn)
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if len(self._idle) >= self.keep:
            self._drop(conn)  # an overflow connection nobody needs now
            return
        self._idle.append(conn)

    def _usable(self, conn: Any) -> bool:
        if conn.is_closed():
            return False
        if self._recycle is not None:
            return time.monotonic() - self._born.get(id(conn), 0.0) < self._recycle
        return True

    async def _alive(self, conn: Any) -> bool:
        if not self._pre_ping:
            return True
        try:
            await conn.execute(";")
        except Exception:
            return False
        return True

    async def _open(self) -> Any:
        fairy = await _pg.connecting(self._engine, self._engine.raw_connection())
        conn: Any = fairy.driver_connection
        fairy.detach()  # ours until closed; the engine's pool opens another for itself
        self._born[id(conn)] = time.monotonic()
        return conn

    def _drop(self, conn: Any) -> None:
        self.size -= 1
        self._born.pop(id(conn), None)
        with suppress(Exception):
            conn.terminate()
        self._wake_one()

    def _wake_one(self) -> None:
        """A slot freed up: let one waiter look again (it may open a connection)."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            self.size -= 1
            self._born.pop(id(conn), None)
            try:
                await asyncio.wait_for(conn.close(), timeout=2)
            except BaseException:
                with suppress(Exception):
                    conn.terminate()
        self._wake_one()


def pool_limits(engine: AsyncEngine) -> dict[str, Any]:
    """`PgPool` settings: durably's options for an engine it made, else the engine's pool."""
    opts = _pg.options_of(engine)
    pool: Any = engine.sync_engine.pool
    if opts is not None:
        budget = _pg.budget_of(opts)  # the one number both pools are sized from
        return {
            "max_size": budget.pool_max,
            "keep": budget.pool_keep,
            "timeout": opts.pool_timeout or getattr(pool, "_timeout", _DEFAULT_POOL_TIMEOUT_S),
            "recycle": opts.pool_recycle,
            "pre_ping": bool(opts.pool_pre_ping),
        }
    size_of = getattr(pool, "size", None)
    size = size_of() if callable(size_of) else _pg.DEFAULT_POOL_SIZE
    overflow = getattr(pool, "_max_overflow", 0)
    recycle = getattr(pool, "_recycle", -1)
    return {
        "max_size": int(size) + max(int(overflow), 0),
        "keep": int(size),
        "timeout": float(getattr(pool, "_timeout", _DEFAULT_POOL_TIMEOUT_S)),
        "recycle": float(recycle) if recycle is not None and recycle >= 0 else None,
        "pre_ping": bool(getattr(pool, "_pre_ping", False)),
    }


# ------------------------------------------------------------------ sessions and connector


class _Grouped:
    """One caller's row in a group of idempotent writes (`PgConnector.execute_idempotent`)."""

    __slots__ = ("args", "future")

    def __init__(self, args: Sequence[Any]) -> None:
        self.args = args
        self.future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def settle(self, error: Exception | None) -> None:
        if self.future.done():  # the caller was cancelled (its row was written all the same)
            return
        if error is None:
            self.future.set_result(None)
        else:
            self.future.set_exception(error)


class PgSession(Session):
    """`Session` on one asyncpg connection (statements compiled by `PgStatements`)."""

    def __init__(self, conn: Any, statements: PgStatements, errors: _Errors) -> None:
        self.raw = conn
        self._statements = statements
        self._errors = errors

    async def fetch(self, stmt: sa.Executable, params: Params = None) -> Sequence[Sequence[Any]]:
        sql, args = self._statements.one(stmt, params)
        try:
            rows: Sequence[Sequence[Any]] = await self.raw.fetch(sql, *args)
        except Exception as error:
            raise self._errors.wrap(error, self.raw, sql, args) from error
        return rows

    async def execute(self, stmt: sa.Executable, params: Params = None) -> int:
        sql, args = self._statements.one(stmt, params)
        try:
            status = await self.raw.execute(sql, *args)
        except Exception as error:
            raise self._errors.wrap(error, self.raw, sql, args) from error
        return _rowcount(status)

    async def executemany(self, stmt: sa.Executable, params: list[dict[str, Any]]) -> None:
        if not params:
            return
        sql, rows = self._statements.many(stmt, params)
        try:
            await self.raw.executemany(sql, rows)
        except Exception as error:
            raise self._errors.wrap(error, self.raw, sql, rows) from error

    async def sql(self, text: str) -> None:
        try:
            await self.raw.execute(text)
        except Exception as error:
            raise self._errors.wrap(error, self.raw, text, ()) from error


class PgConnector(Connector):
    """PostgreSQL through asyncpg directly (see the module docstring)."""

    #: idempotent writes of one statement grouped into one `executemany` at most
    max_group = 256

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._statements = PgStatements(engine.dialect)
        self._errors = _Errors(engine)
        self.pool = PgPool(engine, **pool_limits(engine))
        self._budget_checked = False
        self._groups: dict[str, deque[_Grouped]] = {}
        self._drainers: dict[str, asyncio.Task[None]] = {}
        #: round trips of grouped writes (`executemany` or single), for tests and tuning
        self.group_round_trips = 0

    def register(self, *stmts: sa.Executable | None) -> None:
        self._statements.register(*stmts)

    async def _with(self, work: Callable[[Any], Awaitable[T]]) -> T:
        pool = self.pool
        for attempt in range(_ATTEMPTS):
            conn = await pool.acquire()
            try:
                result = await work(conn)
            except (Exception, asyncio.CancelledError) as error:
                # A database error leaves the connection idle (autocommit, or rolled back by
                # `transaction()`); anything else (cancellation mid-statement, a lost socket)
                # may not: never reuse it then.
                reusable = isinstance(error, sa.exc.DBAPIError) and not conn.is_closed()
                pool.release(conn, discard=not reusable or conn.is_in_transaction())
                if attempt + 1 < _ATTEMPTS and _never_sent(error):
                    continue  # the server closed it just before we used it: use another
                raise
            except BaseException:
                pool.release(conn, discard=True)
                raise
            pool.release(conn)
            return result
        raise AssertionError("unreachable")

    async def read(self, work: Work[T], *, point: bool = False) -> T:
        async def run(conn: Any) -> T:
            return await work(PgSession(conn, self._statements, self._errors))

        return await self._with(run)

    async def write(self, work: Work[T], *, tx: bool = False) -> T:
        async def run(conn: Any) -> T:
            session = PgSession(conn, self._statements, self._errors)
            if not tx:
                return await work(session)
            try:
                async with conn.transaction():
                    return await work(session)
            except sa.exc.SQLAlchemyError:
                raise
            except Exception as error:  # BEGIN / COMMIT failed
                raise self._errors.wrap(error, conn, "COMMIT", ()) from error

        return await self._with(run)

    async def execute(self, stmt: sa.Executable, params: Params = None) -> int:
        sql, args = self._statements.one(stmt, params)

        async def run(conn: Any) -> int:
            try:
                return _rowcount(await conn.execute(sql, *args))
            except Exception as error:
                raise self._errors.wrap(error, conn, sql, args) from error

        return await self._with(run)

    async def fetch(
        self, stmt: sa.Executable, params: Params = None, *, write: bool
    ) -> Sequence[Sequence[Any]]:
        sql, args = self._statements.one(stmt, params)

        async def run(conn: Any) -> Sequence[Sequence[Any]]:
            try:
                rows: Sequence[Sequence[Any]] = await conn.fetch(sql, *args)
            except Exception as error:
                raise self._errors.wrap(error, conn, sql, args) from error
            return rows

        return await self._with(run)

    # -------------------------------------------------------------- grouped idempotent writes

    async def execute_idempotent(self, stmt: sa.Executable, params: Params = None) -> None:
        """Queued per SQL text: while a group of one statement is in flight, the next
        callers' rows wait and then go together as ONE `executemany` (one round trip, one
        implicit transaction, atomic). A lone caller runs at once, as a plain statement.
        Every caller is acknowledged after the commit that contains its row; if a group
        fails, its rows are re-run one by one (they are idempotent upserts), so each caller
        gets its own outcome. A cancelled caller's row is written all the same."""
        sql, args = self._statements.one(stmt, params)
        queue = self._groups.get(sql)
        if queue is None:
            queue = self._groups[sql] = deque()
        item = _Grouped(args)
        queue.append(item)
        if sql not in self._drainers:
            self._drainers[sql] = asyncio.get_running_loop().create_task(self._drain(sql, queue))
        await item.future

    async def _drain(self, sql: str, queue: deque[_Grouped]) -> None:
        try:
            while queue:
                group = [queue.popleft() for _ in range(min(len(queue), self.max_group))]
                await self._run_group(sql, group)
        except BaseException:
            for item in queue:
                item.future.cancel()
            queue.clear()
            raise
        finally:
            self._drainers.pop(sql, None)

    async def _run_group(self, sql: str, group: list[_Grouped]) -> None:
        if len(group) > 1:
            self.group_round_trips += 1
            try:
                await self._with(lambda conn: self._many(conn, sql, [i.args for i in group]))
            except Exception:
                pass  # rolled back as a whole (or unknown): each row alone, below
            else:
                for item in group:
                    item.settle(None)
                return
        for item in group:
            self.group_round_trips += 1
            args = item.args
            try:
                await self._with(lambda conn: self._one(conn, sql, args))  # noqa: B023
            except Exception as error:
                item.settle(error)
            else:
                item.settle(None)

    async def _one(self, conn: Any, sql: str, args: Sequence[Any]) -> None:
        try:
            await conn.execute(sql, *args)
        except Exception as error:
            raise self._errors.wrap(error, conn, sql, args) from error

    async def _many(self, conn: Any, sql: str, rows: list[Sequence[Any]]) -> None:
        try:
            await conn.executemany(sql, rows)
        except Exception as error:
            raise self._errors.wrap(error, conn, sql, rows) from error

    async def schema_transaction(self, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        # Usually the store's first connection: connecting apart, so that a failure to
        # connect is explained (host:port, what failed) while errors of `fn` stay as they are.
        conn = await _pg.connecting(self._engine, self._engine.connect().start())
        try:
            async with conn.begin():
                result = await fn(conn)
            if not self._budget_checked:
                self._budget_checked = True
                await self._check_budget(conn)
            return result
        finally:
            await conn.close()

    def budget(self) -> int:
        """The most connections this store opens: its pool's and the dedicated ones."""
        return self.pool.max_size + _pg.DEDICATED_CONNECTIONS

    async def _check_budget(self, conn: AsyncConnection) -> None:
        """Once, at open: a WARNING when the server has less room for this process than its
        connection budget. Without it, running out shows only as statements failing under
        load ("too many clients"), long after the fleet was sized."""
        try:
            row: Sequence[Any] = tuple((await conn.exec_driver_sql(_ROOM_SQL)).one())
        except Exception as exc:  # no such view or setting, no permission: just unknown
            log.debug("durably: could not read the server's connection limits: %s", exc)
            return
        max_conn, reserved, in_use, superuser, role, role_limit, role_in_use = row[:7]
        db, db_limit, db_in_use = row[7:]
        ours = 1 + self.pool.size  # this connection, and the pool's (counted in `in_use`)
        limits = [
            (
                int(max_conn) - (0 if superuser else int(reserved)) - (int(in_use) - ours),
                f"the server's max_connections is {max_conn}"
                + ("" if superuser else f" ({reserved} reserved)")
                + f" with {int(in_use) - ours} in use by others",
            )
        ]
        if not superuser and role_limit is not None and int(role_limit) >= 0:
            others = int(role_in_use) - ours
            limits.append(
                (
                    int(role_limit) - others,
                    f"role {role!r} has CONNECTION LIMIT {role_limit} with {others} in use by "
                    "others",
                )
            )
        if not superuser and db_limit is not None and int(db_limit) >= 0:
            others = int(db_in_use) - ours
            limits.append(
                (
                    int(db_limit) - others,
                    f"database {db!r} has CONNECTION LIMIT {db_limit} with {others} in use "
                    "by others",
                )
            )
        free, why = min(limits, key=lambda item: item[0])
        budget = self.budget()
        if budget <= free:
            return
        host, port = _pg.connect_target(self._engine)
        log.warning(
            "PostgreSQL at %s:%s has room for %d more connection(s) of this process, but its "
            "store may open up to %d (pool_budget: the pool's %d plus %d dedicated): %s. "
            "Size the fleet so that the budgets of all its processes fit (give each "
            "?pool_budget=N), or raise the limit; when the server runs out, this process "
            "makes do with the connections it has",
            host,
            port,
            max(free, 0),
            budget,
            self.pool.max_size,
            _pg.DEDICATED_CONNECTIONS,
            why,
        )

    async def close(self) -> None:
        """Wait for the grouped writes in flight, then close the connections."""
        while self._drainers:
            await asyncio.wait(set(self._drainers.values()))
        await self.pool.close()


def is_asyncpg(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "postgresql" and engine.dialect.driver == "asyncpg"


__all__ = ["PgConnector", "PgPool", "PgSession", "PgStatements", "is_asyncpg", "pool_limits"]
