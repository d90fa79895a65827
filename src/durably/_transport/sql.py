"""The SQL transport on PostgreSQL (`SqlTransport`): step tasks and results as table rows.

The engine and its step workers share `<prefix>_transport_tasks` and `<prefix>_transport_results`
(prefix `durable` by default), with exactly the DDL the `durable-worker` SDK issues: its
`CREATE TABLE IF NOT EXISTS` and ours are interchangeable, whoever comes first creates them.
Steps only (`features`): the SDK's runner handles step rows and nothing else.

- `dispatch` inserts the task (`grp` = routing token, `input` = JSON text, `status` 'pending')
  with `ON CONFLICT (step_id) DO NOTHING`; priority, trace context and pool id have no column.
- The result drain (`sql_drain`) claims the oldest rows whose lease is free or expired
  (`FOR UPDATE SKIP LOCKED`, stamped with our id and the claim time, one statement), hands
  them to `ResultSink.step_results` and deletes them after it returned, only while they still
  carry our stamp. Every column is checked first (size, depth, numbers, timestamps): a row
  that fails is logged once and fails its step's attempt (`malformed_result`) or, naming no
  step, is deleted. A batch the sink refuses is delivered again row by row, so one
  unstorable row never holds back the others; only an outage keeps the claimed rows for the
  next poll.
- `step_server` (durably's own workers): the same claim on `grp` equal to one of its tokens,
  at most `concurrency` handlers at once; the result insert (`DO NOTHING`) and the task delete
  (of the attempt that ran only) share one transaction. The claims of running steps are renewed
  every third of the lease, so a step longer than the lease is not taken again while its
  worker lives. A malformed task row gets a failed, non-retryable result when its ids are
  consistent (`step_id = run_id:seq`), else is deleted.

Re-dispatch of a step id. A retry reuses the step id, the primary key of both tables, and the
SDK deletes a task only after inserting its result (two autocommitted statements), so:

- a task row of the same or a newer attempt absorbs the dispatch (after a restart, the queued
  or running row answers it);
- a row of an older attempt is obsolete and replaced — but while a worker holds a live claim
  on it, that worker is most likely between its result insert and its task delete, and the
  delete would take the new row with it: dispatch waits up to `replace_wait_ms` for the row to
  go, then replaces it anyway (an attempt still running then answers the step itself);
- a result row of the step under a live claim is being handed to a sink right now and would
  swallow the new attempt's result (`DO NOTHING`): the statement that inserts a new task row
  deletes it (its claimant holds the content). So "settle, delete the result row, resume"
  holds at the table even when the engine re-dispatches before the sink returned.

Wake-ups. The SDK never notifies, so AFTER INSERT triggers NOTIFY on a channel per table (tasks
with their routing token, so a server wakes only for its own); one dedicated connection
LISTENs. Polling stays the floor (a listener reconnecting, a role that may not create
triggers): every `poll_ms`, only after a poll found nothing. 250 ms, half the SDK's default,
bounds the added latency when notifications are lost at four cheap queries a second per
poller. `notify=False` skips the triggers (each notifying commit takes a database-wide lock).

`max_payload_bytes` (default 4 MiB, as the engine's option of that name) bounds each JSON
column read from a row: a task's `input`, a result's `output` and `error`.

Failures raise `TransportUnavailableError` naming host:port and what failed. The URL takes the
SQL store's options (`?schema=`, `connect_timeout`, `application_name`, …).
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any

import sqlalchemy as sa

from durably._core.bounds import DEFAULT_MAX_PAYLOAD_BYTES
from durably._core.handshake import WorkerDescriptor
from durably._core.log_context import durably_logger
from durably._core.models import StepError
from durably._core.wire import (
    RemoteTask,
    StepResult,
    WireFormatError,
    step_id_of,
)
from durably._store.sql import pg as _pg
from durably._transport.protocol import (
    ControlChannel,
    GatewayChannel,
    ResultSink,
    StepHandler,
    StepServer,
    TransportFeatures,
    TransportUnavailableError,
    TurnChannel,
    WorkerDirectory,
    result_size_limit,
)
from durably._transport.sql_drain import ResultDrain
from durably._transport.sql_tables import (
    MAX_ID,
    Connect,
    SqlSettings,
    Statements,
    channel,
    dumps,
    now_ms,
    result_params,
    task_of_row,
)

try:
    import asyncpg  # type: ignore[import-untyped]
except ModuleNotFoundError:  # the `postgres` extra is not installed
    asyncpg = None

log = durably_logger("durably.transport.sql")

__all__ = ["SqlTransport"]

DEFAULT_PREFIX = "durable"
DEFAULT_POLL_MS = 250
DEFAULT_LEASE_MS = 30_000
DEFAULT_BATCH_SIZE = 100
DEFAULT_POOL_SIZE = 4
DEFAULT_REPLACE_WAIT_MS = 2_000

#: Ids are varchar(191) in the shared DDL; a longer one would fail inside PostgreSQL.
_MAX_ID = MAX_ID
#: Reconnect delays of the listener (seconds; the last repeats) and its health check.
_LISTEN_RETRY_S = (0.05, 0.2, 0.5, 1.0, 2.0, 5.0)
_LISTEN_HEALTH_S = 10.0
#: A failing poll backs off from `poll_ms` doubling up to this (seconds).
_MAX_BACKOFF_S = 5.0
#: How often a waiting dispatch looks again for an old task row to go (seconds).
_REPLACE_POLL_S = 0.02


# ------------------------------------------------------------------ the transport


class SqlTransport:
    """The SQL (DB) transport on PostgreSQL; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        poll_ms: int = DEFAULT_POLL_MS,
        lease_ms: int = DEFAULT_LEASE_MS,
        batch_size: int = DEFAULT_BATCH_SIZE,
        pool_size: int | None = None,
        replace_wait_ms: int = DEFAULT_REPLACE_WAIT_MS,
        notify: bool = True,
        auto_create: bool = True,
        instance_id: str | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ):
        if asyncpg is None:
            raise ModuleNotFoundError(
                "the SQL transport needs asyncpg: pip install 'durably[postgres]'"
            )
        for name, value in (("poll_ms", poll_ms), ("lease_ms", lease_ms)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be positive, got {max_payload_bytes}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        parsed = sa.engine.make_url(url)
        if not parsed.drivername.startswith("postgres"):
            raise ValueError(f"the SQL transport needs a postgresql:// URL, got {parsed!r}")
        bare, opts = _pg.split_url(parsed)
        if opts.application_name is None:
            opts.application_name = "durably-transport"
        self._connect_args: dict[str, Any] = _pg.engine_options(opts)["connect_args"]
        self._dsn = bare.set(drivername="postgresql").render_as_string(hide_password=False)
        self._where = f"{bare.host or 'localhost'}:{bare.port or 5432}"
        self._user, self._database = bare.username, bare.database
        self._pool_size = pool_size or opts.pool_size or DEFAULT_POOL_SIZE
        self._sql = Statements(prefix)
        self._poll_s = poll_ms / 1000
        self._lease_ms = lease_ms
        self._batch_size = batch_size
        self._replace_wait_s = replace_wait_ms / 1000
        self._notify = notify
        self._max_payload_bytes = max_payload_bytes
        self._auto_create = auto_create
        self.instance_id = instance_id or f"durably-{uuid.uuid4().hex[:8]}"
        self._pool: Any = None
        self._opening = asyncio.Lock()
        self._schema_ready = False
        self._channels: dict[str, str] = {}  # table name -> NOTIFY channel
        self._listener: asyncio.Task[None] | None = None
        self._drain: ResultDrain | None = None
        self._drainer: asyncio.Task[None] | None = None
        self._results_wake = asyncio.Event()
        self._servers: list[_SqlStepServer] = []
        self._closing = False

    @property
    def kind(self) -> str:
        return "sql"

    @property
    def features(self) -> TransportFeatures:
        return TransportFeatures()

    @property
    def gateway(self) -> GatewayChannel | None:
        return None  # tenants reach a control plane over Redis

    @property
    def control(self) -> ControlChannel | None:
        return None  # no broadcast channel on this transport

    @property
    def directory(self) -> WorkerDirectory | None:
        return None  # no heartbeats or descriptors on this transport

    @property
    def redis_server(self) -> tuple[str, str] | None:
        return None  # not on Redis

    @property
    def turns(self) -> TurnChannel | None:
        return None  # an SDK worker would crash on a workflow-shaped row

    def _settings(self) -> SqlSettings:
        """The settings the result drain and the step servers read."""
        return SqlSettings(
            sql=self._sql,
            instance_id=self.instance_id,
            poll_s=self._poll_s,
            lease_ms=self._lease_ms,
            batch_size=self._batch_size,
            max_payload_bytes=self._max_payload_bytes,
        )

    # ---------------------------------------------------------------- connections

    async def open(self) -> None:
        """Connect (and create the tables) now rather than on first use."""
        await self._ready()

    async def _ready(self) -> Any:
        """The pool, opened (and the tables created) on first use."""
        if self._pool is not None and self._schema_ready:
            return self._pool
        async with self._opening:
            if self._closing:
                raise TransportUnavailableError("SQL transport: closed")
            if self._pool is None:
                try:
                    self._pool = await asyncpg.create_pool(
                        self._dsn, min_size=1, max_size=self._pool_size, **self._connect_args
                    )
                except Exception as exc:
                    raise self._connect_failure(exc) from exc
            if not self._schema_ready:
                await self._ensure_schema()
                self._schema_ready = True
        return self._pool

    @asynccontextmanager
    async def _conn(self, doing: str) -> AsyncIterator[Any]:
        """A pooled connection; database failures inside become TransportUnavailableError
        saying what we were `doing`."""
        pool = await self._ready()
        try:
            conn = await pool.acquire()
        except Exception as exc:
            raise self._connect_failure(exc) from exc
        try:
            yield conn
        except TransportUnavailableError:
            raise
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            raise self._failed(doing, exc) from exc
        finally:
            await pool.release(conn)

    def _connect_failure(self, error: BaseException) -> TransportUnavailableError:
        """What failed when opening a connection, in words: asyncpg's own errors do not name
        the server, and a server that never answers gives a TimeoutError with no text."""
        head = f"SQL transport: cannot connect to PostgreSQL at {self._where}"
        if isinstance(error, TimeoutError):
            seconds = self._connect_args.get("timeout")
            what = (
                f"no connection and PostgreSQL handshake within {seconds:g} s (host down or "
                "unreachable, or not PostgreSQL on that port?); raise ?connect_timeout=SECONDS"
            )
        elif isinstance(error, socket.gaierror):
            what = f"the host name could not be resolved ({error})"
        elif isinstance(error, ConnectionRefusedError):
            what = "connection refused (is PostgreSQL running, and is the port right?)"
        elif isinstance(error, asyncpg.PostgresError):
            what = f"the server refused user {self._user!r} on database {self._database!r}: {error}"
        else:
            what = f"{str(error) or type(error).__name__} ({type(error).__name__})"
        return TransportUnavailableError(f"{head}: {what}")

    def _failed(self, doing: str, error: BaseException) -> TransportUnavailableError:
        if isinstance(error, asyncpg.PostgresError) and not isinstance(
            error, asyncpg.PostgresConnectionError
        ):
            return TransportUnavailableError(
                f"SQL transport: PostgreSQL at {self._where} failed {doing}: "
                f"{type(error).__name__}: {error}"
            )
        return TransportUnavailableError(
            f"SQL transport: lost the connection to PostgreSQL at {self._where} while "
            f"{doing}: {str(error) or type(error).__name__}"
        )

    async def _ensure_schema(self) -> None:
        sql = self._sql
        conn = await self._pool.acquire()
        try:
            if self._auto_create:
                # Several engines starting together: one creates, the others wait and find
                # the tables (PostgreSQL's IF NOT EXISTS alone races on its catalog). SDK
                # workers do not take the lock, so a race lost to one is retried (once per
                # object it may be creating at that moment).
                for attempt in range(3):
                    try:
                        async with conn.transaction():
                            await conn.execute(
                                "SELECT pg_advisory_xact_lock(hashtext($1))",
                                f"durably.transport:{sql.prefix}",
                            )
                            for ddl in sql.create_tables:
                                await conn.execute(ddl)
                            if self._notify:
                                await self._ensure_triggers(conn)
                        break
                    except (
                        asyncpg.UniqueViolationError,
                        asyncpg.DuplicateTableError,
                        asyncpg.DuplicateObjectError,
                    ):
                        if attempt == 2:
                            raise
            schema = await conn.fetchval("SELECT current_schema()")
            for table in (sql.tasks_name, sql.results_name):
                found = await conn.fetchval(sql.table_schema, f'"{table}"')
                self._channels[table] = channel(found or schema, table)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            raise self._failed("creating the transport tables", exc) from exc
        finally:
            await self._pool.release(conn)

    async def _ensure_triggers(self, conn: Any) -> None:
        """The NOTIFY triggers where missing, in a savepoint: a role that may not create them
        (the tables belong to someone else) only loses the wake-ups; polling carries on."""
        try:
            async with conn.transaction():
                for function, trigger, table in self._sql.notify_ddl():
                    if not await conn.fetchval(self._sql.has_trigger, f'"{table}"'):
                        await conn.execute(function)
                        await conn.execute(trigger)
        except asyncpg.InsufficientPrivilegeError as exc:
            log.warning(
                "SQL transport: no NOTIFY triggers on the %s tables (%s); rows are picked up "
                "by polling every %d ms",
                self._sql.prefix,
                exc,
                int(self._poll_s * 1000),
            )

    # ---------------------------------------------------------------- listener

    def _ensure_listener(self) -> None:
        if self._notify and self._listener is None and not self._closing:
            self._listener = asyncio.get_running_loop().create_task(self._listen_loop())

    async def _listen_loop(self) -> None:
        """One dedicated connection LISTENing on both tables' channels, reconnected when
        lost; every (re)connect wakes all pollers, as notifications may have been missed."""
        failures = 0
        while not self._closing:
            try:
                conn = await asyncpg.connect(self._dsn, **self._connect_args)
            except Exception as exc:
                delay = _LISTEN_RETRY_S[min(failures, len(_LISTEN_RETRY_S) - 1)]
                failures += 1
                log.debug("SQL transport: listener connect failed (%s); retry in %gs", exc, delay)
                await asyncio.sleep(delay)
                continue
            failures = 0
            lost = asyncio.Event()
            try:
                conn.add_termination_listener(lambda _conn, lost=lost: lost.set())
                for channel in self._channels.values():
                    await conn.add_listener(channel, self._notified)
                self._wake_all()
                while not lost.is_set() and not self._closing:
                    with suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), _LISTEN_HEALTH_S)
                        break
                    # A connection that died silently (a partition) is replaced.
                    await asyncio.wait_for(conn.execute("SELECT 1"), _LISTEN_HEALTH_S / 2)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("SQL transport: listener lost (%s); reconnecting", exc)
            finally:
                with suppress(Exception):
                    await asyncio.wait_for(conn.close(), 2)
                if not conn.is_closed():
                    conn.terminate()

    def _notified(self, _conn: Any, _pid: int, channel: str, payload: str) -> None:
        if channel == self._channels.get(self._sql.results_name):
            self._results_wake.set()
            return
        for server in self._servers:
            if payload in server.tokens:
                server.wake.set()

    def _wake_all(self) -> None:
        self._results_wake.set()
        for server in self._servers:
            server.wake.set()

    # ---------------------------------------------------------------- engine side

    async def start(self, sink: ResultSink) -> None:
        if self._drainer is not None:
            return
        await self._ready()
        self._ensure_listener()
        # The smaller of this transport's bound and the engine's.
        max_bytes = min(self._max_payload_bytes, result_size_limit(sink))
        drain = ResultDrain(self._conn, self._settings(), self._results_wake, sink, max_bytes)
        self._drain = drain
        self._drainer = asyncio.get_running_loop().create_task(drain.loop())

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        if self._drain is not None:
            self._drain.stop()
        for server in list(self._servers):
            await server.drain(0)
        self._results_wake.set()
        if self._drainer is not None:
            # A batch in the sink is let finish (its rows are then acknowledged); a stuck one
            # keeps its claim and is delivered again after the lease.
            with suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._drainer), 5.0)
        for task in (self._drainer, self._listener):
            if task is not None:
                task.cancel()
                with suppress(BaseException):
                    await task
        if self._pool is not None:
            with suppress(Exception):
                await asyncio.wait_for(self._pool.close(), 5.0)
            self._pool.terminate()
            self._pool = None

    async def dispatch(self, task: RemoteTask) -> None:
        for value in (task.step_id, task.run_id, task.name, task.group):
            if len(value) > _MAX_ID:
                raise ValueError(
                    f"ids, names and tokens are at most {_MAX_ID} characters: {value!r}"
                )
        payload = dumps(task.input)
        doing = f"dispatching step {task.step_id!r}"
        async with self._conn(doing) as conn:
            if await conn.fetchval(self._sql.insert_task, *self._task_args(task, payload)):
                return  # the common case: one statement
        deadline = time.monotonic() + self._replace_wait_s
        while True:
            async with self._conn(doing) as conn:
                force = time.monotonic() >= deadline
                if await self._replace(conn, task, payload, force):
                    return
            await asyncio.sleep(_REPLACE_POLL_S)  # the connection goes back meanwhile

    def _task_args(self, task: RemoteTask, payload: str) -> tuple[Any, ...]:
        now = now_ms()
        ids = (task.step_id, task.run_id, task.seq, task.name, task.group)
        # The last one: result rows claimed since then are being handed to a sink right now.
        return (*ids, payload, task.attempt, now, now - self._lease_ms)

    async def _replace(self, conn: Any, task: RemoteTask, payload: str, force: bool) -> bool:
        """A task row of that step id exists: absorb the dispatch or replace the row (True),
        or wait (False) while a worker holds a live claim on an older attempt."""
        async with conn.transaction():
            old = await conn.fetchrow(self._sql.lock_task, task.step_id)
            if old is not None:
                if old["attempt"] >= task.attempt:
                    return True  # the queued or running row answers this dispatch
                claimed_at = old["claimed_at"]
                live = claimed_at is not None and claimed_at >= now_ms() - self._lease_ms
                if live and not force:
                    return False
                if live:
                    log.info("SQL transport: %s replaces a still claimed attempt", task.step_id)
                await conn.execute(self._sql.delete_task, task.step_id)
            await conn.fetchval(self._sql.insert_task, *self._task_args(task, payload))
        return True

    # ---------------------------------------------------------------- serving side

    async def step_server(
        self,
        tokens: Sequence[str],
        handler: StepHandler,
        *,
        concurrency: int,
        descriptor: WorkerDescriptor | None = None,  # no descriptors on this transport
    ) -> StepServer:
        if not tokens:
            raise ValueError("a step server needs at least one routing token")
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        await self._ready()
        server = _SqlStepServer(
            self._conn, self._settings(), self._servers.remove, list(tokens), handler, concurrency
        )
        self._servers.append(server)
        self._ensure_listener()
        return server


class _SqlStepServer:
    """Claims task rows on its tokens and runs them, at most `concurrency` at once.

    `connect` lends the transport's connections, `settings` are the transport's, and `forget`
    takes the server off the transport's list once it has drained."""

    def __init__(
        self,
        connect: Connect,
        settings: SqlSettings,
        forget: Callable[[_SqlStepServer], None],
        tokens: list[str],
        handler: StepHandler,
        limit: int,
    ):
        self._connect = connect
        self._settings = settings
        self._forget = forget
        self.tokens = frozenset(tokens)
        self._token_list = tokens
        self._handler = handler
        self._limit = limit
        self.instance_id = f"{settings.instance_id}-s{uuid.uuid4().hex[:4]}"
        self.wake = asyncio.Event()  # a notification, a free slot, or the stop
        self._stop = asyncio.Event()
        self._running: dict[asyncio.Task[None], tuple[str, int]] = {}  # -> (step id, stamp)
        self._loop_task = asyncio.get_running_loop().create_task(self._serve_loop())
        self._renew_stop = asyncio.Event()
        self._renewer = asyncio.get_running_loop().create_task(self._renew_loop())

    async def _serve_loop(self) -> None:
        failures = 0
        settings = self._settings
        while not self._stop.is_set():
            free = self._limit - len(self._running)
            self.wake.clear()
            if free <= 0:
                await self.wake.wait()
                continue
            stamp = now_ms()
            try:
                async with self._connect("claiming step tasks") as conn:
                    rows = await conn.fetch(
                        settings.sql.claim_tasks,
                        self._token_list,
                        stamp - settings.lease_ms,
                        free,
                        self.instance_id,
                        stamp,
                    )
                failures = 0
            except Exception as exc:
                failures += 1
                delay = min(settings.poll_s * 2 ** (failures - 1), _MAX_BACKOFF_S)
                log.warning("SQL transport: task claim failed (%s); retry in %.2fs", exc, delay)
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), delay)
                continue
            for row in sorted(rows, key=lambda row: row["created_at"]):
                job = asyncio.get_running_loop().create_task(self._run(row))
                self._running[job] = (row["step_id"], stamp)
                job.add_done_callback(self._finished)
            if not rows:
                with suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), settings.poll_s)

    async def _renew_loop(self) -> None:
        """Renew the claims of the steps running here every third of the lease. Any claim
        older than the lease is free to take, so without renewal a step running longer than
        the lease is claimed again (by this very server too) and runs twice while its first
        run goes on; a worker that dies stops renewing, and its steps come back after the
        lease (BullMQ renews its job locks the same way)."""
        every = self._settings.lease_ms / 3000
        while True:
            with suppress(TimeoutError):
                await asyncio.wait_for(self._renew_stop.wait(), every)
            if self._renew_stop.is_set():
                return
            if self._running:
                await self._renew()

    async def _renew(self) -> None:
        jobs = list(self._running.items())
        ids = [step_id for step_id, _ in self._running.values()]
        stamp = now_ms()
        try:
            async with self._connect("renewing step task claims") as conn:
                await conn.execute(self._settings.sql.renew_tasks, ids, self.instance_id, stamp)
        except Exception as exc:  # the next renewal tries again; past the lease, so be it
            log.warning("SQL transport: renewing step claims failed (%s)", exc)
            return
        for job, (step_id, _) in jobs:
            if job in self._running:  # the release at drain matches the current stamp
                self._running[job] = (step_id, stamp)

    def _finished(self, job: asyncio.Task[None]) -> None:
        self._running.pop(job, None)
        self.wake.set()
        if not job.cancelled() and job.exception() is not None:
            log.error("SQL transport: step job failed", exc_info=job.exception())

    async def _run(self, row: Any) -> None:
        step_id = row["step_id"]
        try:
            task = task_of_row(row, max_bytes=self._settings.max_payload_bytes)
        except WireFormatError as exc:
            await self._reject(row, exc)
            return
        try:
            result = await self._handler(task)
        except Exception as exc:  # the handler contract says it never raises; a bug if it does
            log.exception("SQL transport: step handler raised for step %r", step_id)
            error = StepError(message=f"remote step worker failed: {exc}", retryable=True)
            result = StepResult(task.run_id, task.seq, step_id, "failed", error=error)
        await self._complete(result, step_id, row["attempt"])

    async def _complete(self, result: StepResult, step_id: str, attempt: int) -> None:
        """Insert the result and delete the task in one transaction. Retried while the lease
        lasts: after it, another worker may run the step again anyway."""
        sql = self._settings.sql
        try:
            params = result_params(result)
        except (TypeError, ValueError) as exc:  # re-running it would give the same value
            error = StepError(message=f"step result is not JSON: {exc}", retryable=False)
            params = result_params(
                StepResult(result.run_id, result.seq, step_id, "failed", error=error)
            )
        give_up = time.monotonic() + self._settings.lease_ms / 1000
        failures = 0
        while True:
            try:
                async with self._connect(f"publishing the result of step {step_id!r}") as conn:
                    async with conn.transaction():
                        await conn.execute(sql.insert_result, *params)
                        await conn.execute(sql.finish_task, step_id, attempt)
                return
            except TransportUnavailableError as exc:
                failures += 1
                if time.monotonic() >= give_up:
                    log.error("SQL transport: giving up on the result of %r: %s", step_id, exc)
                    return
                await asyncio.sleep(min(0.1 * 2 ** (failures - 1), _MAX_BACKOFF_S))

    async def _reject(self, row: Any, exc: WireFormatError) -> None:
        """A task row no handler can run: a failed, non-retryable result when the engine can
        match it to its step, else the row is only removed."""
        step_id, run_id, seq = row["step_id"], row["run_id"], row["seq"]
        log.error("SQL transport: malformed task row for step %r: %s", step_id, exc.problem)
        if run_id and step_id == step_id_of(run_id, seq):
            error = StepError(message=f"malformed step task: {exc.problem}", retryable=False)
            result = StepResult(run_id, seq, step_id, "failed", error=error)
            await self._complete(result, step_id, row["attempt"])
            return
        with suppress(TransportUnavailableError):
            async with self._connect(f"deleting malformed task {step_id!r}") as conn:
                await conn.execute(self._settings.sql.finish_task, step_id, row["attempt"])

    async def drain(self, timeout: float) -> None:
        self._stop.set()
        self.wake.set()
        with suppress(BaseException):
            await self._loop_task
        if self._running:
            await asyncio.wait(list(self._running), timeout=max(timeout, 0.0))
        # Stopped, not cancelled, before the stamps are read: a renewal cut short could leave
        # stamps the release below misses.
        self._renew_stop.set()
        with suppress(BaseException):
            await self._renewer
        leftover = dict(self._running)
        for job in leftover:
            job.cancel()
        for job in leftover:
            with suppress(BaseException):
                await job
        # Cancelled steps go back to the queue now rather than after the lease.
        release = self._settings.sql.release_tasks
        for step_id, stamp in leftover.values():
            with suppress(Exception):
                async with self._connect("releasing step tasks") as conn:
                    await conn.execute(release, [step_id], self.instance_id, stamp)
        with suppress(ValueError):
            self._forget(self)
