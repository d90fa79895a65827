"""Cross-process wake-ups over PostgreSQL LISTEN/NOTIFY (`WakeBus`).

One bus per `SqlStateStore.wake_bus()` call. It LISTENs on ONE dedicated asyncpg connection
(taken from the store's engine, then detached from the pool so it never counts against the
pool size and always carries the engine's connect arguments, `search_path` included) on the
channel of the store's schema (`pg.wake_channel`: `durable_wake_<schema>`), so stores on
different schemas of one database never see each other's messages. The payload is
`"<kind>:<run_id>"`, or `"<kind>*:<JSON array of run ids>"` for a batch: publishes made in the
same event-loop turn are coalesced into one NOTIFY per kind (a wide fan's children settling
together cost one statement, not one each), split to stay under PostgreSQL's 8,000-byte
payload limit.

`publish` runs `SELECT pg_notify(channel, payload)` on a pooled connection through the store
(one statement, counted in `statement_count`); PostgreSQL delivers it when that autocommitted
statement commits — to every listener of the channel, this bus's own included.

When the listener connection is lost (server restart, `pg_terminate_backend`, network
error), asyncpg reports it at once and the bus reconnects in the background with
exponential backoff (`RECONNECT_DELAYS`, then the last delay forever) and LISTENs again; a
periodic `SELECT 1` on the listener (`HEALTH_INTERVAL_S`) catches a connection that died
silently.
Messages published while it was away are lost: delivery is best effort and at most once, and
the engine's polling is the fallback. `close()` stops the listener and any reconnect loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from durably._core.log_context import durably_logger
from durably._store.protocol import WakeHandler

log = durably_logger("durably.store.wakebus")

#: Seconds between reconnect attempts of a lost listener (the last one repeats).
RECONNECT_DELAYS: tuple[float, ...] = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)
#: Every so many seconds the listener connection runs `SELECT 1` (at most `HEALTH_TIMEOUT_S`):
#: a connection that died without the socket noticing (a network partition) is replaced.
HEALTH_INTERVAL_S = 10.0
HEALTH_TIMEOUT_S = 5.0

#: Bytes of run ids per batched NOTIFY (PostgreSQL's payload limit is 8,000 bytes).
PAYLOAD_BUDGET = 7_000

Notify = Callable[[str, str], Awaitable[None]]
"""`notify(channel, payload)`: the store's counted `SELECT pg_notify(...)`."""


def _payloads(kind: str, run_ids: list[str]) -> list[str]:
    """One `kind:<id>` message for a single run, else `kind*:<JSON array>` chunks."""
    if len(run_ids) == 1:
        return [f"{kind}:{run_ids[0]}"]
    out: list[str] = []
    chunk: list[str] = []
    size = 0
    for run_id in run_ids:
        cost = len(json.dumps(run_id)) + 1
        if chunk and size + cost > PAYLOAD_BUDGET:
            out.append(f"{kind}*:{json.dumps(chunk)}")
            chunk, size = [], 0
        chunk.append(run_id)
        size += cost
    if chunk:
        out.append(f"{kind}*:{json.dumps(chunk)}" if len(chunk) > 1 else f"{kind}:{chunk[0]}")
    return out


class PgWakeBus:
    """`WakeBus` on LISTEN/NOTIFY (see the module docstring)."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        channel: Callable[[], Awaitable[str]],
        notify: Notify,
        on_close: Callable[[PgWakeBus], None] | None = None,
    ) -> None:
        self._engine = engine
        self._resolve_channel = channel
        self._notify = notify
        self._on_close = on_close
        self._handler: WakeHandler | None = None
        self._channel: str | None = None
        self._conn: Any = None  # the asyncpg connection LISTENing
        self._reconnect: asyncio.Task[None] | None = None
        self._health: asyncio.Task[None] | None = None
        self._closed = False
        #: connections (re)established so far; the first one is made by `start`
        self.connects = 0
        #: messages handed to the handler
        self.delivered = 0
        #: publishes that failed (logged, not raised: delivery is best effort)
        self.publish_failures = 0
        self._outbox: dict[str, tuple[list[str], asyncio.Future[None]]] = {}
        self._flushes: set[asyncio.Task[None]] = set()

    @property
    def channel(self) -> str | None:
        return self._channel

    @property
    def listener_pid(self) -> int | None:
        """Server process id of the LISTENing connection (None while disconnected)."""
        conn = self._conn
        if conn is None or conn.is_closed():
            return None
        pid: int = conn.get_server_pid()
        return pid

    @property
    def connected(self) -> bool:
        return self.listener_pid is not None

    # ------------------------------------------------------------------ WakeBus

    async def start(self, handler: WakeHandler) -> None:
        """Begin delivering to `handler`; LISTEN is active when this returns. A second call
        replaces the handler. Raises if the first connection cannot be made."""
        if self._closed:
            raise RuntimeError("the wake bus is closed")
        self._handler = handler
        if self._conn is None and self._reconnect is None:
            await self._connect()
        if self._health is None:
            self._health = asyncio.get_running_loop().create_task(self._health_loop())

    async def publish(self, kind: str, run_id: str) -> None:
        """`pg_notify` on the store's pool, coalesced with the other publishes of this loop
        turn; returns once the message is sent. A failure is logged and counted, not raised."""
        batch = self._outbox.get(kind)
        if batch is None:
            batch = self._outbox[kind] = ([], asyncio.get_running_loop().create_future())
            task = asyncio.get_running_loop().create_task(self._flush(kind, batch))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)
        batch[0].append(run_id)
        await asyncio.shield(batch[1])

    async def _flush(self, kind: str, batch: tuple[list[str], asyncio.Future[None]]) -> None:
        await asyncio.sleep(0)  # let the rest of this turn's publishes join
        if self._outbox.get(kind) is batch:
            del self._outbox[kind]
        ids, done = batch
        try:
            if self._channel is None:
                self._channel = await self._resolve_channel()
            for payload in _payloads(kind, list(dict.fromkeys(ids))):
                await self._notify(self._channel, payload)
        except Exception as error:
            self.publish_failures += 1
            log.warning("wake bus: publish of %s (%d runs) failed: %s", kind, len(ids), error)
        finally:
            if not done.done():
                done.set_result(None)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for flush in list(self._flushes):  # pending publishes give up (best effort)
            flush.cancel()
        for _ids, done in self._outbox.values():
            if not done.done():
                done.set_result(None)
        self._outbox.clear()
        for task in (self._reconnect, self._health):
            if task is not None:
                task.cancel()
                with suppress(BaseException):
                    await task
        self._reconnect = self._health = None
        conn, self._conn = self._conn, None
        if conn is not None:
            await _close_quietly(conn)
        if self._on_close is not None:
            self._on_close(self)

    # ------------------------------------------------------------------ the listener

    async def _connect(self) -> None:
        fairy = await self._engine.raw_connection()
        conn: Any = fairy.driver_connection
        fairy.detach()  # ours for good: the pool opens another one in its place
        try:
            if self._channel is None:
                self._channel = await self._resolve_channel()
            conn.add_termination_listener(self._lost)
            await conn.add_listener(self._channel, self._on_notification)
        except BaseException:
            await _close_quietly(conn)
            raise
        if self._closed:
            await _close_quietly(conn)
            return
        self._conn = conn
        self.connects += 1
        if conn.is_closed():  # lost before its termination listener could tell
            self._lost(conn)

    def _on_notification(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        handler = self._handler
        if handler is None or self._closed:
            return
        kind, sep, rest = payload.partition(":")
        if not sep:
            return  # not ours
        run_ids = [rest]
        if kind.endswith("*"):
            kind = kind[:-1]
            try:
                run_ids = [str(run_id) for run_id in json.loads(rest)]
            except (ValueError, TypeError):
                return  # not ours
        for run_id in run_ids:
            self.delivered += 1
            try:
                handler(kind, run_id)
            except Exception:
                log.exception("wake bus: handler failed for %s:%s", kind, run_id)

    def _lost(self, conn: Any) -> None:
        if conn is not self._conn or self._closed:
            return
        self._conn = None
        log.warning("wake bus: listener connection lost; reconnecting")
        if self._reconnect is None:
            self._reconnect = asyncio.get_running_loop().create_task(self._reconnect_loop())

    async def _health_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            conn = self._conn
            if conn is None or conn.is_closed():
                continue  # lost: the reconnect loop is on it
            try:
                await asyncio.wait_for(conn.execute("SELECT 1"), HEALTH_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("wake bus: listener health check failed (%s); reconnecting", error)
                with suppress(Exception):
                    conn.terminate()
                self._lost(conn)

    async def _reconnect_loop(self) -> None:
        attempt = 0
        try:
            while not self._closed:
                await asyncio.sleep(RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)])
                attempt += 1
                try:
                    await self._connect()
                except Exception as error:
                    log.debug("wake bus: reconnect attempt %d failed: %s", attempt, error)
                    continue
                log.info("wake bus: listener reconnected after %d attempt(s)", attempt)
                return
        finally:
            if self._reconnect is asyncio.current_task():
                self._reconnect = None


async def _close_quietly(conn: Any) -> None:
    try:
        await asyncio.wait_for(conn.close(), timeout=2)
    except BaseException:
        with suppress(Exception):
            conn.terminate()


__all__ = ["HEALTH_INTERVAL_S", "HEALTH_TIMEOUT_S", "RECONNECT_DELAYS", "PgWakeBus"]
