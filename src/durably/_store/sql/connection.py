"""Connection strategies of the SQL store, one per backend (chosen by `connectors.py`).

SQLite allows ONE writer per database: every write of a process goes through one dedicated
connection (`SqliteConnector`), fed by a group-commit loop — the requests queued while the
previous batch ran are executed together in one `BEGIN IMMEDIATE` … `COMMIT` (prebuilt
statements in ONE hop to the aiosqlite thread) and acknowledged after that COMMIT; a prebuilt
statement alone in its event-loop turn is autocommitted on the loop's own thread instead
(`sqlite_lane.py`). Other processes wait on `busy_timeout`. Reads use the pool (WAL
readers never block the writer). PostgreSQL runs on asyncpg directly (`pgconn.py`), or on
SQLAlchemy's pool with another driver (`PoolConnector`).

Store code runs `work(session)` callbacks, or hands single statements over as data
(`Connector.execute` / `fetch`); a `Session` executes statements on one connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import StaticPool

from durably._store.sql.compiled import Compiled, FastStatements
from durably._store.sql.dialect import sqlite_pragmas_of
from durably._store.sql.sqlite_lane import BUSY, LoopLane, open_lane_connection

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


def _consume(future: asyncio.Future[Any]) -> None:
    """Retrieve a background request's outcome (no 'exception never retrieved' warning)."""
    if not future.cancelled():
        future.exception()


def _wrap_dbapi_error(sql: str, args: Any, error: Exception) -> Exception:
    return sa.exc.DBAPIError.instance(sql, args, error, sqlite3.Error)


_Op = tuple[bool, str, Sequence[Any]]  # (returns rows, SQL text, positional arguments)
_Outcome = tuple[bool, Any]  # (succeeded, result or exception)
_SAVEPOINT = "durably_request"


def _run_ops(
    conn: sqlite3.Connection, ops: Sequence[_Op], begin: bool, commit: bool, in_tx: bool
) -> list[Any] | None:
    """Runs in the aiosqlite thread: a whole group of statements in ONE hop.

    Each op's outcome is its rows, its row count, or the exception it raised. A failing
    statement is backed out alone (SQLite's statement atomicity) and the transaction stays
    open, so a failed request does not disturb its batch-mates. `None`: the transaction
    (`in_tx`) was lost — an error rolled all of it back, or COMMIT failed (and was rolled
    back): nothing of it is committed.
    """
    if begin:
        conn.execute("BEGIN IMMEDIATE")
    out: list[Any] = []
    for rows, sql, args in ops:
        try:
            cursor = conn.execute(sql, args)
            out.append(cursor.fetchall() if rows else cursor.rowcount)
        except Exception as error:
            if in_tx and not conn.in_transaction:
                return None
            out.append(error)
    if commit:
        try:
            conn.execute("COMMIT")
        except Exception:
            if conn.in_transaction:
                with suppress(Exception):
                    conn.execute("ROLLBACK")
            return None
    return out


class AiosqliteThread:
    """The thread aiosqlite runs one sqlite3 connection on: the only thread that connection
    may be used from, so work on it (a batch of statements, a transaction probe) is sent
    there as a function.

    aiosqlite has no public call for either (its queue, `_execute`, and its sqlite3
    connection, `_conn`, are private): this class is the one place that reaches into it, so
    an aiosqlite change breaks here and nowhere else. Its two lines name the private-member
    rule (SLF001) as allowed, and RUF100 so that naming it is not reported while that rule is
    not yet selected."""

    __slots__ = ("_raw",)

    def __init__(self, raw: Any) -> None:
        self._raw = raw

    @property
    def connection(self) -> sqlite3.Connection:
        """The sqlite3 connection, to be passed to functions `call` runs on its thread."""
        conn: sqlite3.Connection = self._raw._conn  # noqa: SLF001 (see the class)
        return conn

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the connection's thread."""
        result: T = await self._raw._execute(fn, *args)  # noqa: SLF001 (see the class)
        return result


class SqliteSession(Session):
    """`Session` whose registered statements run in one aiosqlite call (see FastStatements)."""

    def __init__(self, conn: AsyncConnection, raw: Any, fast: FastStatements) -> None:
        super().__init__(conn)
        self._raw = raw
        self._thread = AiosqliteThread(raw)
        self._fast = fast
        # The SQLAlchemy path is not safe for concurrent use of one AsyncConnection; the
        # one-call fast path is (aiosqlite queues calls on its thread).
        self._sa_lock = asyncio.Lock()
        #: fetch / execute / executemany calls so far (what the store counts through it)
        self.statements = 0

    async def fetch(self, stmt: sa.Executable, params: Params = None) -> Sequence[Sequence[Any]]:
        self.statements += 1
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
        self.statements += 1
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
        self.statements += 1
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

    async def run_ops(
        self, ops: Sequence[_Op], begin: bool, commit: bool, in_tx: bool
    ) -> list[Any] | None:
        """`_run_ops` in ONE call on the aiosqlite thread."""
        thread = self._thread
        return await thread.call(_run_ops, thread.connection, ops, begin, commit, in_tx)

    async def in_transaction(self) -> bool:
        thread = self._thread
        return bool(await thread.call(getattr, thread.connection, "in_transaction"))

    async def call_in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the thread of this session's sqlite3 connection."""
        return await self._thread.call(fn, *args)

    async def sql(self, text: str) -> None:
        try:
            # fetch in the worker thread: statements that return a row (PRAGMA) finish there
            await self._raw.execute_fetchall(text)
        except sqlite3.Error as error:
            raise _wrap_dbapi_error(text, (), error) from error


# ------------------------------------------------------------------ connection strategies


class Connector:
    """How the store obtains connections. `work` runs with a `Session`; with `tx=True` the
    whole of `work` is one transaction (rolled back if it raises). `execute` / `fetch` run
    ONE statement given as data (a connector may group it with other callers' statements)."""

    #: Told how many statements (as counted by the store through a `work` session) ran in an
    #: attempt that was rolled back with its group and is about to be re-run, so that the
    #: store's `statement_count` counts each request's statements once.
    on_rerun: Callable[[int], None] | None = None

    def register(self, *stmts: sa.Executable | None) -> None:
        """Statements built once by the store (eligible for a driver fast path)."""

    async def read(self, work: Work[T], *, point: bool = False) -> T:
        """`point=True`: a small indexed read (one statement) that may share the writer."""
        raise NotImplementedError

    async def write(self, work: Work[T], *, tx: bool = False) -> T:
        raise NotImplementedError

    async def execute(self, stmt: sa.Executable, params: Params = None) -> int:
        """One write statement, autocommitted by itself; the affected-row count."""

        async def work(s: Session) -> int:
            return await s.execute(stmt, params)

        return await self.write(work)

    async def execute_idempotent(self, stmt: sa.Executable, params: Params = None) -> None:
        """One IDEMPOTENT write statement whose row count the caller does not need (an
        upsert). A connector may run concurrent ones of the same statement together
        (PostgreSQL: one `executemany` round trip, one commit) and re-run one whose outcome
        is unknown; acknowledged after its commit."""
        await self.execute(stmt, params)

    async def fetch(
        self, stmt: sa.Executable, params: Params = None, *, write: bool
    ) -> Sequence[Sequence[Any]]:
        """One statement's rows: a write (`… RETURNING`) or, `write=False`, a point read."""

        async def work(s: Session) -> Sequence[Sequence[Any]]:
            return await s.fetch(stmt, params)

        return await (self.write(work) if write else self.read(work, point=True))

    async def schema_transaction(self, fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """`fn(conn)` inside one transaction on an SQLAlchemy connection (migrations)."""

        async def work(s: Session) -> T:
            return await fn(s.conn)

        return await self.write(work, tx=True)

    async def close(self) -> None:
        return None


# ------------------------------------------------------------------ SQLite group commit


class _Request:
    """One caller's request to the SQLite writer: a statement given as data (`stmt`,
    `params`; `entry`/`args` when it has a one-hop fast path) or a `work` callback. Its
    `future` is settled only after the COMMIT of the batch that contains it."""

    __slots__ = ("args", "entry", "future", "params", "rows", "stmt", "tx", "work", "writes")

    def __init__(
        self,
        *,
        writes: bool,
        work: Work[Any] | None = None,
        tx: bool = False,
        stmt: sa.Executable | None = None,
        params: Params = None,
        rows: bool = False,
        entry: Compiled | None = None,
    ) -> None:
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.writes = writes
        self.work = work
        self.tx = tx
        self.stmt = stmt
        self.params = params
        self.rows = rows
        self.entry = entry
        self.args = entry.args(params) if entry is not None else ()

    def op(self) -> _Op:
        assert self.entry is not None
        return self.rows, self.entry.sql, self.args

    def outcome(self, result: Any) -> _Outcome:
        """The outcome of this request's fast-path op (`_run_ops`)."""
        if isinstance(result, sqlite3.Error):
            assert self.entry is not None
            return False, _wrap_dbapi_error(self.entry.sql, self.args, result)
        if isinstance(result, BaseException):
            return False, result
        return True, result if self.rows else int(result)

    def settle(self, outcome: _Outcome) -> None:
        if self.future.done():  # the caller was cancelled (its write ran all the same)
            return
        if outcome[0]:
            self.future.set_result(outcome[1])
        else:
            self.future.set_exception(outcome[1])


class SqliteConnector(Connector):
    """One dedicated writer connection per store (SQLite allows a single writer), fed by a
    group-commit loop.

    Every request on the writer (single statements, `tx` work, point reads) is queued; at
    the end of the loop turn `_dispatch` sends a lone prebuilt statement to the loop lane
    (`sqlite_lane.py`) and anything else to the writer loop. The writer loop takes ALL
    requests queued when it wakes (up to `max_batch`) and runs them in
    arrival order inside ONE `BEGIN IMMEDIATE` … `COMMIT` — prebuilt statements in a single
    hop to the aiosqlite thread (`_run_ops`), other statements and `work` callbacks on the
    session, each `work` under a SAVEPOINT — and settles each caller's future only after that
    COMMIT: nothing is acknowledged before it is durable. A batch that only reads runs
    without a transaction; a batch of one runs as before (autocommitted statement, or its
    own `BEGIN IMMEDIATE` transaction for `tx` work).

    A failing request fails alone: a statement is backed out by SQLite's statement
    atomicity, a `work` by rolling back to its savepoint, and the batch-mates commit. Should
    the transaction itself be lost (an error that rolls it back, a failed COMMIT), nothing
    was committed or acknowledged and the requests are re-run one by one, each in its own
    transaction, so every caller gets exactly its own result or error.

    The write lock is taken up front (`BEGIN IMMEDIATE`), so another process waits on
    `busy_timeout` instead of failing with a deadlock between two deferred transactions.
    Callers never run on the connection themselves: a cancelled caller stops waiting, but its
    request runs (and commits) with its batch, never half.

    Point reads (`read(point=True)`, `fetch(write=False)`) go through the writer too: one
    thread, no pool round trip, and they see every write acknowledged before them. Scans and
    list queries use the engine's pool (WAL readers do not block the writer). An in-memory
    database's single `StaticPool` connection is the writer for everything.
    """

    #: Requests per group commit at most.
    max_batch = 256

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._writer_session: SqliteSession | None = None
        self._shared = isinstance(engine.sync_engine.pool, StaticPool)
        self._fast = FastStatements(engine.dialect)
        self._queue: deque[_Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._dispatch_handle: asyncio.Handle | None = None  # `_dispatch`, when scheduled
        self._lane: LoopLane | None = None  # opened with the writer (sqlite_lane.py)
        self._closed = False

    def register(self, *stmts: sa.Executable | None) -> None:
        self._fast.register(*stmts)

    # -------------------------------------------------------------- requests

    async def write(self, work: Work[T], *, tx: bool = False) -> T:
        """`tx=False` work must be ONE statement (it is not wrapped in a transaction when it
        runs alone)."""
        result: T = await self._submit(_Request(writes=True, work=work, tx=tx))
        return result

    async def read(self, work: Work[T], *, point: bool = False) -> T:
        if self._shared or point:
            result: T = await self._submit(_Request(writes=False, work=work))
            return result
        async with self._engine.connect() as conn:
            return await work(await self._session(conn))

    async def execute(self, stmt: sa.Executable, params: Params = None) -> int:
        return int(await self._submit(self._statement(stmt, params, rows=False, writes=True)))

    async def fetch(
        self, stmt: sa.Executable, params: Params = None, *, write: bool
    ) -> Sequence[Sequence[Any]]:
        rows: Sequence[Sequence[Any]] = await self._submit(
            self._statement(stmt, params, rows=True, writes=write)
        )
        return rows

    def _statement(
        self, stmt: sa.Executable, params: Params, *, rows: bool, writes: bool
    ) -> _Request:
        entry = self._fast.compiled(stmt, params)
        return _Request(writes=writes, stmt=stmt, params=params, rows=rows, entry=entry)

    async def _submit(self, request: _Request) -> Any:
        self._queue.append(request)
        if self._task is None and self._dispatch_handle is None:
            # Decide after the callbacks already due in this loop turn have run: requests
            # they submit join this one (a group commit); a request still alone then takes
            # the loop lane.
            self._dispatch_handle = asyncio.get_running_loop().call_soon(self._dispatch)
        return await request.future

    def _dispatch(self) -> None:
        """Start the writer for what was queued during this loop turn: ONE fast-path
        statement on the loop lane when it is open (sqlite_lane.py: no thread hand-off; a
        sequential workflow's checkpoint writes), anything else (or a lane answer of
        BUSY) as group commits on the writer thread.

        Why not the lane for every lone request as it arrives: concurrent workflows
        then commit one by one on the loop's core, and lose the group commit that runs their
        COMMITs on the writer thread in parallel with the loop (measured: 18k → 11k steps/s).
        A request whose caller was cancelled meanwhile still runs (never half)."""
        self._dispatch_handle = None
        queue = self._queue
        if self._task is not None or not queue:
            return
        lane = self._lane
        if len(queue) == 1 and queue[0].entry is not None and lane is not None and lane.open:
            request = queue[0]
            try:
                result = lane.run(request.rows, *request.op()[1:])
            except Exception:  # the lane itself broke (not the statement): drop it, use the
                self._close_lane()  # writer thread; nothing was settled, the request stays
                result = BUSY
            if result is not BUSY:
                queue.popleft()
                request.settle(request.outcome(result))
                if lane.checkpoint_due():
                    self._checkpoint_in_background()
                return
        self._task = asyncio.get_running_loop().create_task(self._drain())

    def _checkpoint_in_background(self) -> None:
        """A PASSIVE checkpoint on the writer thread (the lane's connection never runs one:
        sqlite_lane.py). Nobody waits for it and its outcome is dropped: one that does not
        complete (it shared a batch's transaction, or readers held frames) leaves the frames
        to the next one, and the writer connection keeps SQLite's own auto-checkpoint for
        the commits it makes itself."""

        async def checkpoint(session: Session) -> None:
            assert isinstance(session, SqliteSession)
            await session.sql("PRAGMA wal_checkpoint(PASSIVE)")

        request = _Request(writes=False, work=checkpoint)
        request.future.add_done_callback(_consume)
        self._queue.append(request)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._drain())

    # -------------------------------------------------------------- the writer loop

    async def _drain(self) -> None:
        queue = self._queue
        try:
            while queue:
                batch = [queue.popleft() for _ in range(min(len(queue), self.max_batch))]
                await self._run_batch(batch)
        except BaseException:
            while queue:
                queue.popleft().future.cancel()
            raise
        finally:
            self._task = None
            if self._closed:
                # A request made after `close()` (a read by a caller that outlived the
                # store) is served, but the writer connection it reopened is closed again
                # at once: nobody would close it later, and it would stay checked out of
                # the pool until the garbage collector dropped it unclosed.
                await self._close_writer()

    async def _run_batch(self, batch: list[_Request]) -> None:
        try:
            if len(batch) == 1:
                await self._alone(batch[0])
                return
            try:
                session = await self._writer()
            except Exception as error:
                for request in batch:
                    request.settle((False, error))
                return
            if not await self._grouped(session, batch):
                for request in batch:
                    await self._alone(request)
        except Exception as error:  # not expected: fail the batch, keep the loop serving
            for request in batch:
                request.settle((False, error))  # no-op for the settled ones
        except BaseException:
            for request in batch:
                request.future.cancel()  # no-op for the settled ones
            raise

    async def _grouped(self, session: SqliteSession, batch: list[_Request]) -> bool:
        """Run `batch` in one transaction and settle every request after its COMMIT. False:
        the transaction was lost (nothing committed, nothing settled)."""
        tx = any(request.writes for request in batch)
        segments: list[list[_Request] | _Request] = []
        run: list[_Request] | None = None  # the current run of fast-path statements
        for request in batch:
            if request.entry is None:
                segments.append(request)
                run = None
            elif run is None:
                run = [request]
                segments.append(run)
            else:
                run.append(request)
        commit_last = tx and isinstance(segments[-1], list)
        outcomes: list[_Outcome] = []
        begun = False
        work_statements = 0  # counted by the store; handed back if the attempt is lost
        try:
            for index, segment in enumerate(segments):
                if isinstance(segment, list):
                    results = await session.run_ops(
                        [request.op() for request in segment],
                        begin=tx and not begun,
                        commit=commit_last and index == len(segments) - 1,
                        in_tx=tx,
                    )
                    begun = tx
                    if results is None:
                        break
                    outcomes.extend(map(_Request.outcome, segment, results))
                    continue
                if tx and not begun:
                    await session.sql("BEGIN IMMEDIATE")
                    begun = True
                before = session.statements
                outcome = await self._in_batch(session, segment, tx)
                if segment.work is not None:
                    work_statements += session.statements - before
                if outcome is None:
                    break
                outcomes.append(outcome)
            else:
                if tx and not commit_last:
                    committed = await session.run_ops([], begin=False, commit=True, in_tx=True)
                    if committed is None:
                        outcomes.clear()
        except Exception as error:
            if tx and not begun:  # BEGIN IMMEDIATE failed (e.g. busy timeout): nothing ran
                if isinstance(error, sqlite3.Error):
                    error = _wrap_dbapi_error("BEGIN IMMEDIATE", (), error)
                for request in batch:
                    request.settle((False, error))
                return True
            if begun:
                await self._abandon(session)
            outcomes.clear()
        except BaseException:
            if begun:
                await self._abandon(session)
            raise
        if len(outcomes) < len(batch):  # lost
            if work_statements and self.on_rerun is not None:
                self.on_rerun(work_statements)
            return False
        for request, outcome in zip(batch, outcomes, strict=True):
            request.settle(outcome)
        return True

    async def _in_batch(
        self, session: SqliteSession, request: _Request, tx: bool
    ) -> _Outcome | None:
        """A slow-path statement or a `work` inside the batch (`work` under a savepoint when
        the batch writes). None: the batch's transaction was lost."""
        savepoint = tx and request.work is not None
        if savepoint:
            await session.sql(f"SAVEPOINT {_SAVEPOINT}")
        try:
            value = await self._call(session, request)
        except Exception as error:
            if session.conn.invalidated or (tx and not await session.in_transaction()):
                return None
            if savepoint:
                await session.sql(f"ROLLBACK TO {_SAVEPOINT}")
                await session.sql(f"RELEASE {_SAVEPOINT}")
            return False, error
        if savepoint:
            await session.sql(f"RELEASE {_SAVEPOINT}")
        return True, value

    async def _abandon(self, session: SqliteSession) -> None:
        """Roll back a batch's transaction after an unexpected error; a connection that
        cannot is discarded."""
        try:
            if await session.in_transaction():
                await session.sql("ROLLBACK")
        except BaseException:
            await self._discard()

    async def _alone(self, request: _Request) -> None:
        """`request` by itself: a statement or plain `work` autocommitted, `tx` work in its
        own transaction."""
        try:
            session = await self._writer()
            if request.entry is not None:
                results = await session.run_ops([request.op()], False, False, False)
                assert results is not None  # (no transaction to lose)
                outcome = request.outcome(results[0])
            elif request.tx:
                assert request.work is not None
                outcome = True, await self._transaction(session, request.work)
            else:
                outcome = True, await self._call(session, request)
        except Exception as error:
            outcome = False, error
        request.settle(outcome)

    @staticmethod
    async def _call(session: SqliteSession, request: _Request) -> Any:
        if request.work is not None:
            return await request.work(session)
        assert request.stmt is not None
        if request.rows:
            return await session.fetch(request.stmt, request.params)
        return await session.execute(request.stmt, request.params)

    async def _transaction(self, session: SqliteSession, work: Work[T]) -> T:
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

    # -------------------------------------------------------------- the connection

    async def _session(self, conn: AsyncConnection) -> SqliteSession:
        raw = (await conn.get_raw_connection()).driver_connection
        return SqliteSession(conn, raw, self._fast)

    @staticmethod
    def _usable(session: SqliteSession | None) -> bool:
        return session is not None and not session.conn.closed and not session.conn.invalidated

    async def _writer(self) -> SqliteSession:
        """The writer session, (re)opened on demand; only the writer loop calls this."""
        session = self._writer_session
        if session is not None and self._usable(session):
            return session
        if session is not None:
            await self._discard()
        conn = await self._engine.connect()
        try:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            session = await self._session(conn)
            for pragma in sqlite_pragmas_of(self._engine):
                await session.sql(pragma)
        except BaseException:
            with suppress(Exception):
                await conn.close()
            raise
        self._writer_session = session
        await self._open_lane(session)
        return session

    async def _open_lane(self, session: SqliteSession) -> None:
        """The loop lane (sqlite_lane.py) for a database file; none for an in-memory or URI
        database, or when it cannot be opened (everything then uses the writer thread)."""
        url = self._engine.url
        path = url.database
        if self._shared or not path or path == ":memory:" or url.query.get("uri"):
            return
        with suppress(Exception):
            conn = await session.call_in_thread(
                open_lane_connection, path, sqlite_pragmas_of(self._engine)
            )
            self._lane = LoopLane(conn)

    def _close_lane(self) -> None:
        lane, self._lane = self._lane, None
        if lane is not None:
            with suppress(Exception):
                lane.close()

    async def _discard(self) -> None:
        self._close_lane()
        session, self._writer_session = self._writer_session, None
        if session is not None:
            with suppress(Exception):
                await session.conn.invalidate()
            with suppress(Exception):
                await session.conn.close()

    async def close(self) -> None:
        """Wait for the writer loop to drain, then close the writer connection (and return
        it to the pool). Requests made afterwards still run, each batch on a writer that is
        closed again when the batch ends (`_drain`)."""
        self._closed = True
        while self._task is not None or self._dispatch_handle is not None:
            if self._task is not None:
                await asyncio.wait({self._task})
            else:
                await asyncio.sleep(0)  # let the scheduled `_dispatch` run
        await self._close_writer()

    async def _close_writer(self) -> None:
        self._close_lane()
        session, self._writer_session = self._writer_session, None
        if session is not None:
            with suppress(Exception):
                await session.conn.close()


class PoolConnector(Connector):
    """PostgreSQL on a driver other than asyncpg: SQLAlchemy's pool; single statements in
    autocommit, `tx` work in `engine.begin()`."""

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


__all__ = [
    "AiosqliteThread",
    "Connector",
    "FastStatements",
    "PoolConnector",
    "Session",
    "SqliteConnector",
    "SqliteSession",
]
