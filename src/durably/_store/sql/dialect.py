"""Every difference between the SQLite and PostgreSQL flavours of the SQL store lives here.

- URL normalisation (`sqlite://…` → `sqlite+aiosqlite://…`, `postgresql://…` →
  `postgresql+asyncpg://…`) and default engine options (in-memory SQLite gets a `StaticPool`);
- the per-connection SQLite pragmas (WAL, `synchronous=NORMAL`, `busy_timeout`, no FKs,
  case-sensitive LIKE);
- column types that differ (`REAL` vs `DOUBLE PRECISION`, `AUTOINCREMENT` vs `IDENTITY`);
- upsert (`INSERT … ON CONFLICT … DO UPDATE` exists on both, via each dialect's `insert`);
- RETURNING support (SQLite ≥ 3.35), prefix predicates and the "take the oldest buffered
  signal" statement;
- the schema lock for migrations (`BEGIN IMMEDIATE` on SQLite, `pg_advisory_xact_lock` on PG);
- the connection strategy (`Connector`): SQLite allows one writer, so every write of a process
  goes through ONE dedicated connection guarded by an `asyncio.Lock` (other processes wait on
  `busy_timeout`), while reads use the pool (WAL readers never block the writer). PostgreSQL
  uses the pool for everything.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sqlite3
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import closing, suppress
from typing import Any, TypeVar, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.dialects import postgresql as _pg
from sqlalchemy.dialects import sqlite as _sqlite
from sqlalchemy.engine import URL, Dialect, make_url
from sqlalchemy.engine.default import DefaultDialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.dml import Insert

T = TypeVar("T")
Work = Callable[["Session"], Awaitable[T]]
Params = dict[str, Any] | None

SQLITE = "sqlite"
POSTGRESQL = "postgresql"

BUSY_TIMEOUT_MS = 10_000
SQLITE_PRAGMAS: tuple[str, ...] = (
    # busy_timeout first: switching to WAL briefly needs the write lock.
    f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
    "PRAGMA journal_mode=WAL",
    "PRAGMA synchronous=NORMAL",
    "PRAGMA foreign_keys=OFF",
    "PRAGMA case_sensitive_like=ON",
)
SCHEMA_LOCK_KEY = "durable_schema"

_SQLITE_SYNC_DRIVERS = {"sqlite", "sqlite+pysqlite"}
_PG_SYNC_DRIVERS = {"postgresql", "postgres", "postgresql+psycopg2", "postgresql+pg8000"}


# ------------------------------------------------------------------ column types


def double_type() -> sa.types.TypeEngine[float]:
    """`num_value`: DOUBLE PRECISION on PostgreSQL, REAL on SQLite (store.md §5.1)."""
    return sa.Double().with_variant(sa.REAL(), SQLITE)


def identity_pk_column(name: str) -> sa.Column[int]:
    """Autoincrement primary key: `INTEGER PRIMARY KEY AUTOINCREMENT` on SQLite (a rowid
    alias; the table needs `sqlite_autoincrement=True`), `BIGINT GENERATED ALWAYS AS IDENTITY`
    on PostgreSQL."""
    return sa.Column(
        name,
        sa.BigInteger().with_variant(sa.Integer(), SQLITE),
        sa.Identity(always=True),
        primary_key=True,
        nullable=False,
    )


# Rendered into the frozen DDL text of migrations (same meaning as the two helpers above).
def ddl_double(name: str) -> str:
    return "REAL" if name == SQLITE else "DOUBLE PRECISION"


def ddl_identity_pk(name: str) -> str:
    if name == SQLITE:
        return "INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT"
    return "BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY"


def ddl_now_ms(name: str) -> str:
    """SQL expression for the current time in epoch milliseconds (BIGINT)."""
    if name == SQLITE:
        return "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"


# ------------------------------------------------------------------ URLs and engines


def normalize_url(url: str | URL) -> URL:
    """Map a user URL onto the async driver durably uses for it.

    `sqlite:///rel.db`, `sqlite:////abs.db`, `sqlite://` (memory) → `sqlite+aiosqlite`;
    `postgresql://` / `postgres://` → `postgresql+asyncpg`. An explicit async driver is kept.
    """
    parsed = make_url(url) if isinstance(url, str) else url
    driver = parsed.drivername
    if driver in _SQLITE_SYNC_DRIVERS:
        return parsed.set(drivername="sqlite+aiosqlite")
    if driver in _PG_SYNC_DRIVERS:
        return parsed.set(drivername="postgresql+asyncpg")
    return parsed


def dialect_name_of(url: URL) -> str:
    backend = url.get_backend_name()
    if backend not in (SQLITE, POSTGRESQL):
        raise ValueError(f"unsupported database for the durably SQL store: {backend!r}")
    return backend


def is_memory_sqlite(url: URL) -> bool:
    if url.get_backend_name() != SQLITE:
        return False
    database = url.database or ""
    return database in ("", ":memory:") or url.query.get("mode") == "memory"


def _supports_skip_autocommit_rollback() -> bool:
    return "skip_autocommit_rollback" in inspect.signature(DefaultDialect.__init__).parameters


def default_engine_options(url: URL) -> dict[str, Any]:
    if url.get_backend_name() != SQLITE:
        return {}
    # DBAPI autocommit: a single statement is its own transaction (one round trip, no
    # BEGIN/COMMIT); multi-statement work issues BEGIN IMMEDIATE / COMMIT itself.
    options: dict[str, Any] = {"isolation_level": "AUTOCOMMIT"}
    if _supports_skip_autocommit_rollback():
        options["skip_autocommit_rollback"] = True
    if is_memory_sqlite(url):
        # One shared connection, so every session sees the same in-memory database.
        options["poolclass"] = StaticPool
    return options


def _apply_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        for pragma in SQLITE_PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def install_sqlite_pragmas(engine: AsyncEngine) -> None:
    """Run `SQLITE_PRAGMAS` on every new DBAPI connection of `engine` (idempotent)."""
    if engine.dialect.name != SQLITE:
        return
    target = engine.sync_engine
    if not event.contains(target, "connect", _apply_sqlite_pragmas):
        event.listen(target, "connect", _apply_sqlite_pragmas)


def create_engine(url: str | URL, **engine_options: Any) -> AsyncEngine:
    """An `AsyncEngine` for `url` with durably's defaults (caller options win)."""
    normalized = normalize_url(url)
    dialect_name_of(normalized)
    options = default_engine_options(normalized)
    options.update(engine_options)
    engine = create_async_engine(normalized, **options)
    install_sqlite_pragmas(engine)
    return engine


def sqlite_returning_supported() -> bool:
    return sqlite3.sqlite_version_info >= (3, 35, 0)


def sqlite_json_supported() -> bool:
    """JSON1 (`json_each`) is built in since SQLite 3.38 and in nearly every older build."""
    try:
        with closing(sqlite3.connect(":memory:")) as conn:
            conn.execute("SELECT value FROM json_each('[1]')").fetchall()
    except sqlite3.Error:
        return False
    return True


def offline_dialect(name: str) -> Dialect:
    """A SQLAlchemy dialect for rendering SQL without a connection."""
    factory: Any = _sqlite.dialect if name == SQLITE else _pg.dialect
    return cast(Dialect, factory())


# ------------------------------------------------------------------ per-dialect SQL


def _prefix_upper_bound(prefix: str) -> str | None:
    """Smallest string greater than every string starting with `prefix` (code-point order)."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if 0xD800 <= code <= 0xDFFF:
            code = 0xE000  # surrogates cannot be stored as UTF-8
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


class SqlDialect:
    """The SQL that differs between SQLite and PostgreSQL, for one engine."""

    def __init__(self, name: str, *, returning: bool | None = None) -> None:
        if name not in (SQLITE, POSTGRESQL):
            raise ValueError(f"unsupported database for the durably SQL store: {name!r}")
        self.name = name
        self.is_sqlite = name == SQLITE
        if returning is None:
            returning = sqlite_returning_supported() if self.is_sqlite else True
        #: `UPDATE/DELETE … RETURNING` (SQLite ≥ 3.35, PostgreSQL always).
        self.supports_returning = returning
        # SQLite compares TEXT with BINARY collation (= code-point order), so a range
        # predicate can use an index for prefix scans; PostgreSQL's default collation cannot.
        self.prefix_range = self.is_sqlite
        # SQLite passes variable-length lists as ONE JSON parameter (`json_each`), so the
        # statement text stays fixed (prebuilt, one driver call); PostgreSQL expands IN lists.
        self.json_lists = self.is_sqlite and sqlite_json_supported()

    # --- upsert

    def insert(self, table: sa.Table) -> Insert:
        if self.is_sqlite:
            return _sqlite.insert(table)
        return _pg.insert(table)

    def upsert(self, table: sa.Table, key_columns: Sequence[str]) -> Insert:
        """`INSERT … ON CONFLICT (keys) DO UPDATE SET every other column = excluded.column`."""
        keys = set(key_columns)
        stmt: Any = self.insert(table)
        excluded = stmt.excluded
        return stmt.on_conflict_do_update(  # type: ignore[no-any-return]
            index_elements=list(key_columns),
            set_={c.name: excluded[c.name] for c in table.c if c.name not in keys},
        )

    def insert_ignore(self, table: sa.Table, key_columns: Sequence[str]) -> Insert:
        stmt: Any = self.insert(table)
        return stmt.on_conflict_do_nothing(index_elements=list(key_columns))  # type: ignore[no-any-return]

    # --- variable-length IN lists with a fixed statement text

    def in_list(self, column: sa.ColumnElement[Any], name: str) -> sa.ColumnElement[bool]:
        """`column IN (<list bound as :name>)`; bind the value from `list_value`."""
        if self.json_lists:
            members: sa.Select[Any] = sa.select(sa.literal_column("value")).select_from(
                sa.func.json_each(sa.bindparam(name, type_=sa.Text))
            )
            return column.in_(members)
        return column.in_(sa.bindparam(name, expanding=True))

    def list_value(self, values: Sequence[Any]) -> Any:
        return json.dumps(list(values)) if self.json_lists else list(values)

    def in_pairs(
        self, first: sa.ColumnElement[Any], second: sa.ColumnElement[Any], name: str
    ) -> sa.ColumnElement[bool]:
        """`(first, second) IN (<pairs bound as :name>)`; bind the value from `pairs_value`."""
        if self.json_lists:
            value: sa.ColumnClause[Any] = sa.literal_column("value")
            members = sa.select(
                sa.func.json_extract(value, "$[0]"), sa.func.json_extract(value, "$[1]")
            ).select_from(sa.func.json_each(sa.bindparam(name, type_=sa.Text)))
            return sa.tuple_(first, second).in_(members)
        return sa.tuple_(first, second).in_(sa.bindparam(name, expanding=True))

    def pairs_value(self, pairs: Sequence[tuple[Any, Any]]) -> Any:
        if self.json_lists:
            return json.dumps([list(p) for p in pairs])
        return [tuple(p) for p in pairs]

    # --- prefix matching (store.md §5.4: never LIKE)

    def prefix_params(self, prefix: str) -> tuple[bool, dict[str, Any]]:
        """(use the ranged statement?, bind parameters) for `prefix_predicate`."""
        params: dict[str, Any] = {"p": prefix, "plen": len(prefix)}
        if self.prefix_range and prefix:
            upper = _prefix_upper_bound(prefix)
            if upper is not None:
                params["p_hi"] = upper
                return True, params
        return False, params

    @staticmethod
    def prefix_predicate(column: sa.ColumnElement[str], *, ranged: bool) -> sa.ColumnElement[bool]:
        """`substr(col, 1, :plen) = :p` (exact, case-sensitive), plus an index-friendly
        `col >= :p AND col < :p_hi` range when `ranged` (see `prefix_params`)."""
        exact = sa.func.substr(column, 1, sa.bindparam("plen", type_=sa.Integer)) == sa.bindparam(
            "p", type_=sa.Text
        )
        if not ranged:
            return exact
        return sa.and_(
            column >= sa.bindparam("p", type_=sa.Text),
            column < sa.bindparam("p_hi", type_=sa.Text),
            exact,
        )

    @staticmethod
    def literal_prefix_predicate(
        column: sa.ColumnElement[str], prefix: str
    ) -> sa.ColumnElement[bool]:
        return sa.func.substr(column, 1, len(prefix)) == prefix

    # --- buffered signals (store.md §3.7)

    def take_oldest_signal(self, table: sa.Table) -> sa.Executable:
        """`DELETE … WHERE id = (oldest id for :token) RETURNING payload`.

        PostgreSQL locks the picked row with `FOR UPDATE SKIP LOCKED` so two concurrent
        takers get two different rows instead of one of them finding nothing.
        """
        oldest = (
            sa.select(table.c.id)
            .where(table.c.token == sa.bindparam("token", type_=sa.Text))
            .order_by(table.c.id)
            .limit(1)
        )
        if not self.is_sqlite:
            oldest = oldest.with_for_update(skip_locked=True)
        return (
            sa.delete(table)
            .where(table.c.id == oldest.scalar_subquery())
            .returning(table.c.payload)
        )

    # --- schema lock (migrations)

    def schema_lock_statement(self) -> str | None:
        """Run first inside the migration transaction (PostgreSQL); SQLite's `BEGIN
        IMMEDIATE` already holds the single write lock."""
        if self.is_sqlite:
            return None
        return f"SELECT pg_advisory_xact_lock(hashtext('{SCHEMA_LOCK_KEY}'))"

    def connector(self, engine: AsyncEngine) -> Connector:
        if self.is_sqlite:
            return SqliteConnector(engine)
        return PoolConnector(engine)


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
            await self._raw.execute(text)
        except sqlite3.Error as error:
            raise _wrap_dbapi_error(text, (), error) from error


# ------------------------------------------------------------------ connection strategies


class Connector:
    """How the store obtains connections. `work` runs with a `Session`; with `tx=True` the
    whole of `work` is one transaction (rolled back if it raises)."""

    def register(self, *stmts: sa.Executable | None) -> None:
        """Statements built once by the store (eligible for a driver fast path)."""

    async def read(self, work: Work[T]) -> T:
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

    Reads use the engine's pool (WAL readers do not block the writer), except for an
    in-memory database whose single `StaticPool` connection is the writer itself.
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

    async def read(self, work: Work[T]) -> T:
        if self._shared:
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

    async def read(self, work: Work[T]) -> T:
        async with self._autocommit.connect() as conn:
            return await work(Session(conn))

    async def write(self, work: Work[T], *, tx: bool = False) -> T:
        if tx:
            async with self._engine.begin() as conn:
                return await work(Session(conn))
        async with self._autocommit.connect() as conn:
            return await work(Session(conn))


__all__ = [
    "POSTGRESQL",
    "SQLITE",
    "SQLITE_PRAGMAS",
    "Connector",
    "FastStatements",
    "PoolConnector",
    "Session",
    "SqlDialect",
    "SqliteConnector",
    "SqliteSession",
    "create_engine",
    "ddl_double",
    "ddl_identity_pk",
    "ddl_now_ms",
    "default_engine_options",
    "dialect_name_of",
    "double_type",
    "identity_pk_column",
    "install_sqlite_pragmas",
    "is_memory_sqlite",
    "normalize_url",
    "offline_dialect",
    "sqlite_json_supported",
    "sqlite_returning_supported",
]
