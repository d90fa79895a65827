"""Fleet-wide admission to flow-control queues on PostgreSQL (`PgAdmission`).

Every engine of a fleet that shares a PostgreSQL store counts the same slots, in four tables
(created by schema migration 5, `admission_schema.py`): `durable_admission_queues` (one row
per queue: its rate window, arrival and service counters, and the settings last used to
admit, which a release needs to tell who ranks first), `_slots` (holder = step id, the
owning process, expiry), `_waiters` (holder, priority, fairness key, arrival, expiry) and
`_keys` (when each fairness key was last served).

- **One statement admits a slot.** `SELECT durable_admission_acquire(...)` runs a PL/pgSQL
  function. It first locks its queue's row, so the callers of one queue take turns (callers
  of other queues do not wait). Inside a function each statement sees what was committed
  before it started, so after the lock every count includes the previous caller's slot — a
  plain single statement could not do that: it reads one snapshot taken before it waited
  for the lock, and would over-admit under concurrency. The function applies the rules of
  `durably._core.admission` (lapsed slots and waiters dropped, the aligned rate window, the
  ranking) and answers 0 (admitted) or the epoch ms to ask again at.
- **No slot leaks when a process dies.** A slot expires `slot_ttl` after it was last
  renewed; a live engine renews the slots it holds with one UPDATE every third of the
  shortest TTL, a dead one stops, and the next acquire on that queue drops the slot.
- **A release wakes the next in line.** `durable_admission_release(holders, now, channel)`
  deletes the holders' slots and places in line and, for each queue where it freed a slot,
  NOTIFYs the channel of the store's schema with the queue and its best waiters. Each
  engine LISTENs (a `PgWakeBus` on that channel) and wakes the waiters it holds; a lost
  notice costs latency only (every waiter asks again at its `retry_at`).

Times are the engines' clocks (epoch ms passed in), as for run leases.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Collection, Sequence
from typing import Any

import sqlalchemy as sa

from durably._core.admission import (
    ADMITTED,
    Admission,
    FreedListener,
    Queue,
    QueueStats,
    window_count,
)
from durably._core.bounds import PayloadRejectedError
from durably._core.log_context import durably_logger
from durably._store.sql.connection import Connector
from durably._store.sql.store import SqlStateStore
from durably._store.sql.wakebus import PgWakeBus

log = durably_logger("durably.store")

__all__ = ["PgAdmission", "store_admission"]

_CHANNEL_PREFIX = "durable_adm_"

# ------------------------------------------------------------------ the backend

_ACQUIRE = sa.text(
    "SELECT durable_admission_acquire(:queue, :holder, :owner, :key, :priority, :now, "
    ":concurrency, :rate_limit, :rate_period, :retry, :slot_ttl, :fair, :lifo)"
)
_RELEASE = sa.text("SELECT durable_admission_release(:holders, :now, :channel)")
_RENEW = sa.text(
    "UPDATE durable_admission_slots SET expires_at = :now + ttl_ms "
    "WHERE holder = ANY(:holders) AND owner = :owner AND expires_at > :now RETURNING holder"
)
# The counts of the console and the metrics: one read, through the queue and expiry indexes,
# taking no lock (a count may be a commit behind; it changes nothing).
_STATS = sa.text(
    "SELECT q.queue, q.window_start, q.window_count, q.served, "
    "(SELECT count(*) FROM durable_admission_slots s "
    " WHERE s.queue = q.queue AND s.expires_at > :now), "
    "(SELECT count(*) FROM durable_admission_waiters w "
    " WHERE w.queue = q.queue AND w.expires_at > :now) "
    "FROM durable_admission_queues q WHERE q.queue = ANY(:queues)"
)
_CURRENT_SCHEMA = sa.text("SELECT current_schema()")


def data_problem(exc: BaseException) -> str | None:
    """Why PostgreSQL refused the VALUES of a statement (SQLSTATE class 22, data exception:
    a NUL or an unencodable character in a text argument, a number out of range; class 23,
    integrity), or None for anything else — a dropped connection, a timeout, a server that
    is shutting down — which is an outage, worth asking again. Asking again with the same
    values can only fail the same way, so a data error is never retried as an outage."""
    if isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated:
        return None
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        err = todo.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        state = getattr(err, "sqlstate", None)
        if isinstance(state, str) and state[:2] in ("22", "23"):
            text = str(err).strip() or type(err).__name__
            return f"PostgreSQL refused a value ({text}; SQLSTATE {state})"
        todo.extend((err.__cause__, getattr(err, "orig", None)))
    return None


def _channel_of(schema: str) -> str:
    """The NOTIFY channel of the admission tables in `schema` (at most 63 bytes)."""
    name = _CHANNEL_PREFIX + schema
    if len(name.encode()) <= 63:
        return name
    return _CHANNEL_PREFIX + hashlib.sha1(schema.encode()).hexdigest()[:16]


class PgAdmission:
    """The PostgreSQL admission backend (see the module docstring). One per engine: `owner`
    is the engine's instance id, whose slots `renew` keeps alive."""

    def __init__(self, store: SqlStateStore, *, owner: str, clock: Callable[[], int]):
        if store.dialect.is_sqlite:
            raise ValueError("PgAdmission needs a PostgreSQL store")
        self._store = store
        self._cx: Connector = store.connector
        self._cx.register(_ACQUIRE, _RELEASE, _RENEW, _STATS)
        self._owner = owner
        self._clock = clock
        self._listeners: list[FreedListener] = []
        self._channel: str | None = None
        self._bus: PgWakeBus | None = None
        self._listening: asyncio.Task[None] | None = None
        self._closed = False

    async def _channel_name(self) -> str:
        if self._channel is None:
            schema = self._store.schema
            if schema is None:
                rows = await self._cx.fetch(_CURRENT_SCHEMA, None, write=False)
                schema = str(rows[0][0]) if rows and rows[0][0] is not None else "public"
            self._channel = _channel_of(schema)
        return self._channel

    async def acquire(self, queue: Queue, holder: str, *, key: str, priority: int = 0) -> Admission:
        self._listen_soon()
        params = {
            "queue": queue.name,
            "holder": holder,
            "owner": self._owner,
            "key": key,
            "priority": priority,
            "now": self._clock(),
            "concurrency": queue.concurrency,
            "rate_limit": queue.rate_limit,
            "rate_period": queue.rate_period_ms,
            "retry": queue.retry_ms,
            "slot_ttl": queue.slot_ttl_ms,
            "fair": queue.fair,
            "lifo": queue.lifo,
        }
        try:
            rows = await self._cx.fetch(_ACQUIRE, params, write=True)
        except Exception as exc:
            problem = data_problem(exc)
            if problem is None:
                raise  # the connection or the server: an outage, asked again later
            raise PayloadRejectedError(
                f"flow-control admission to queue {queue.name!r}", problem
            ) from exc
        retry_at = int(rows[0][0])
        return ADMITTED if retry_at == 0 else Admission(False, retry_at)

    async def release(self, *holders: str) -> int:
        if not holders:
            return 0
        channel = await self._channel_name() if self._listeners else None
        params = {"holders": list(holders), "now": self._clock(), "channel": channel}
        rows = await self._cx.fetch(_RELEASE, params, write=True)
        return int(rows[0][0] or 0)

    async def renew(self, holders: Collection[str]) -> set[str]:
        if not holders:
            return set()
        params = {"holders": list(holders), "now": self._clock(), "owner": self._owner}
        rows = await self._cx.fetch(_RENEW, params, write=True)
        return {str(row[0]) for row in rows}

    def on_freed(self, listener: FreedListener) -> None:
        self._listeners.append(listener)

    async def stats(self, queues: Sequence[Queue]) -> list[QueueStats]:
        if not queues:
            return []
        now = self._clock()
        params = {"queues": [q.name for q in queues], "now": now}
        rows = {str(r[0]): r for r in await self._cx.fetch(_STATS, params, write=False)}
        out: list[QueueStats] = []
        for queue in queues:
            row = rows.get(queue.name)
            if row is None:
                out.append(QueueStats(queue.name))
                continue
            out.append(
                QueueStats(
                    queue.name,
                    in_flight=int(row[4]),
                    waiting=int(row[5]),
                    window_count=window_count(queue, now, int(row[1]), int(row[2])),
                    admitted=int(row[3]),
                )
            )
        return out

    def _listen_soon(self) -> None:
        """LISTEN once there is someone to tell (started by the first acquire, in the
        background: an acquire never waits for it)."""
        if self._listeners and self._listening is None and not self._closed:
            if self._store.engine.dialect.driver != "asyncpg":
                return  # LISTEN needs asyncpg; waiters then ask again at their retry_at
            self._listening = asyncio.get_running_loop().create_task(self._listen())

    async def _listen(self) -> None:
        bus = PgWakeBus(self._store.engine, channel=self._channel_name, notify=_no_notify)
        try:
            await bus.start(self._on_message)
        except Exception as exc:
            log.warning("flow control: cannot LISTEN for freed slots (%s); polling only", exc)
            await bus.close()
            return
        if self._closed:
            await bus.close()
            return
        self._bus = bus

    def _on_message(self, kind: str, rest: str) -> None:
        if kind != "freed":
            return
        queue, *holders = rest.split("\n")
        for listener in tuple(self._listeners):
            listener(queue, holders)

    async def close(self) -> None:
        self._closed = True
        task, self._listening = self._listening, None
        if task is not None:
            try:
                await task
            except Exception:
                pass
        bus, self._bus = self._bus, None
        if bus is not None:
            await bus.close()


async def _no_notify(channel: str, payload: str) -> None:
    """The release function NOTIFYs from inside the database; the bus never publishes."""


def store_admission(store: Any, *, owner: str, clock: Callable[[], int]) -> PgAdmission | None:
    """The fleet-wide backend on `store` when it is a PostgreSQL store; None for any other
    store (SQLite: the engines sharing a file are one machine's, counted per engine)."""
    if isinstance(store, SqlStateStore) and not store.dialect.is_sqlite:
        return PgAdmission(store, owner=owner, clock=clock)
    return None
