"""Buffered signals of the SQL store, bounded per token and per namespace (the contract is
written on `durably._store.protocol.StateStore`).

- `buffer_signal_bounded` is ONE statement: `INSERT … SELECT … WHERE (live rows of the
  token) < :per_token AND (live rows of the namespace) < :per_ns`, each count reading at
  most cap rows of an index. SQLite runs one writer at a time, so the caps are exact there.
  On PostgreSQL (READ COMMITTED) each statement counts the rows committed before it started:
  N signals buffered on one token or namespace at the same instant can exceed a cap by at
  most N - 1 — bounded by the number of concurrent senders, never unbounded growth.
- Expiry is judged by the store's clock (`:now` binds), like every other time it writes.
- Listing returns the payload's size in bytes, never the payload.
- A buffered signal consumed by a wait (`take_buffered_signal_into`) or handed by a sender to
  a waiter (`deliver_buffered_signal`) leaves the buffer in the transaction that writes the
  checkpoint holding its payload: a crash between two statements would lose it. Buffered
  events are taken the same way (`take_buffered_event_into`, `deliver_buffered_event`). Each first
  looks with one point read, so the common miss costs no transaction. On PostgreSQL the
  waiter row of the token is locked first (`FOR UPDATE`), then the checkpoint row, in the
  order `deliver_signals` takes them: concurrent deliveries to one wait queue behind each
  other and the later finds the waiter gone.

A part object of `SqlStateStore` (which forwards the contract methods to it), given what it
uses: the store's `StatementRunner` (every statement runs and is counted there), its
prebuilt `Statements`, its `SqlDialect` and its clock.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import bindparam

from durably._core.buffered_signals import BufferedSignalInfo, BufferScope
from durably._core.models import (
    BufferedEvent,
    BufferedSignal,
    JSONValue,
    StepCheckpoint,
    delivered_signal,
    utc_from_ms,
)
from durably._core.tokens import token_namespace
from durably._core.triggers import ACCUMULATOR_PREFIX
from durably._store.sql import rows as _rows
from durably._store.sql.connection import Session
from durably._store.sql.dialect import SqlDialect
from durably._store.sql.runner import StatementRunner
from durably._store.sql.schema import buffered_events, buffered_signals
from durably._store.sql.statements import Statements

_bs = buffered_signals.c
_TABLE = buffered_signals.name
_NAMESPACE_CHILD = "child"  # the engine's own completion records keep no expiry
_MIGRATION_TTL_MS = 24 * 3_600_000
_MISS = object()  # no live row was taken (a row's payload may itself be NULL: None)


# ------------------------------------------------------------------ migration 3 (frozen)


def migration_v3(dialect_name: str) -> list[str]:
    """DDL of migration 3 (frozen: a published migration never changes).

    PostgreSQL adds the columns (`IF NOT EXISTS`). SQLite cannot add a column
    conditionally, and a database made by `metadata.create_all` already has them, so the
    table is rebuilt instead (copy, drop, rename) — the same statements work on both shapes.
    "Now" is one instant for the whole migration (SQLite: per statement; PostgreSQL: the
    transaction's start), so every old row gets exactly the same TTL.
    """
    ttl = _MIGRATION_TTL_MS
    if dialect_name == "sqlite":
        now_ms = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
        namespace = (
            "CASE WHEN instr(token, ':') > 0 THEN substr(token, 1, instr(token, ':') - 1) "
            "ELSE token END"
        )
        new = f"{_TABLE}__v3"
        return [
            f"DROP TABLE IF EXISTS {new}",
            f"CREATE TABLE {new} ("
            " id INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,"
            " token TEXT NOT NULL, payload TEXT, namespace TEXT,"
            " buffered_at BIGINT, expires_at BIGINT)",
            f"INSERT INTO {new} (id, token, payload, namespace, buffered_at, expires_at)"
            f" SELECT id, token, payload, {namespace}, {now_ms},"
            f" CASE WHEN ({namespace}) = '{_NAMESPACE_CHILD}' THEN NULL"
            f" ELSE {now_ms} + {ttl} END"
            f" FROM {_TABLE} ORDER BY id",
            f"DROP TABLE {_TABLE}",
            f"ALTER TABLE {new} RENAME TO {_TABLE}",
            f"CREATE INDEX IF NOT EXISTS {_TABLE}_token_idx ON {_TABLE} (token, id)",
            *_v3_indexes(),
        ]
    now_ms = "CAST(EXTRACT(EPOCH FROM transaction_timestamp()) * 1000 AS BIGINT)"
    return [
        f"ALTER TABLE {_TABLE} ADD COLUMN IF NOT EXISTS namespace TEXT",
        f"ALTER TABLE {_TABLE} ADD COLUMN IF NOT EXISTS buffered_at BIGINT",
        f"ALTER TABLE {_TABLE} ADD COLUMN IF NOT EXISTS expires_at BIGINT",
        f"UPDATE {_TABLE} SET namespace = split_part(token, ':', 1) WHERE namespace IS NULL",
        f"UPDATE {_TABLE} SET buffered_at = {now_ms} WHERE buffered_at IS NULL",
        f"UPDATE {_TABLE} SET expires_at = {now_ms} + {ttl}"
        f" WHERE expires_at IS NULL AND namespace <> '{_NAMESPACE_CHILD}'",
        *_v3_indexes(),
    ]


def _v3_indexes() -> list[str]:
    return [
        f"CREATE INDEX IF NOT EXISTS {_TABLE}_namespace_idx ON {_TABLE} (namespace, expires_at)",
        f"CREATE INDEX IF NOT EXISTS {_TABLE}_expires_at_idx ON {_TABLE} (expires_at)",
    ]


# ------------------------------------------------------------------ statements


def _size_bytes(dialect: SqlDialect) -> sa.ColumnElement[Any]:
    if dialect.is_sqlite:
        return sa.func.coalesce(sa.func.length(sa.cast(_bs.payload, sa.LargeBinary)), 0)
    return sa.func.coalesce(sa.func.octet_length(_bs.payload), 0)


def _prefix_where(dialect: SqlDialect, prefix: str | None) -> list[sa.ColumnElement[bool]]:
    """Tokens starting with `prefix` (exact, case-sensitive: `substr`, never LIKE)."""
    if prefix is None or prefix == "":
        return []
    return [dialect.literal_prefix_predicate(_bs.token, prefix)]


# ------------------------------------------------------------------ bounded events

_be = buffered_events.c


def _external_event() -> sa.ColumnElement[bool]:
    """Not one of the engine's own accumulator events (which never expire and no cap
    refuses): `substr`, never LIKE (`_` is a LIKE wildcard)."""
    prefix = ACCUMULATOR_PREFIX
    return sa.func.substr(_be.name, 1, len(prefix)) != sa.literal(prefix, type_=sa.Text)


def _live_events_below(by_name: bool, cap: str) -> sa.ColumnElement[bool]:
    """Fewer than `:cap` live external events (of `:name` when `by_name`), reading at most
    cap rows; live: published after `:since`."""
    where = [_external_event(), _be.published_at > bindparam("since", type_=sa.BigInteger)]
    if by_name:
        where.append(_be.name == bindparam("name", type_=sa.Text))
    limit = bindparam(cap, type_=sa.Integer)
    rows = sa.select(sa.literal(1).label("one")).where(*where).limit(limit).subquery()
    return sa.select(sa.func.count()).select_from(rows).scalar_subquery() < limit


_INSERT_EVENT_BOUNDED = sa.insert(buffered_events).from_select(
    ["id", "name", "payload", "published_at"],
    sa.select(
        sa.cast(bindparam("id", type_=sa.Text), sa.Text),
        sa.cast(bindparam("name", type_=sa.Text), sa.Text),
        sa.cast(bindparam("payload", type_=sa.Text), sa.Text),
        sa.cast(bindparam("published_at", type_=sa.BigInteger), sa.BigInteger),
    ).where(
        _live_events_below(True, "per_name"),
        _live_events_below(False, "per_ns"),
    ),
)
_COUNT_NAME_LIVE = (
    sa.select(sa.func.count())
    .select_from(buffered_events)
    .where(
        _be.name == bindparam("name", type_=sa.Text),
        _be.published_at > bindparam("since", type_=sa.BigInteger),
    )
)
_PURGE_EVENTS = sa.delete(buffered_events).where(
    _external_event(), _be.published_at <= bindparam("before", type_=sa.BigInteger)
)


# ------------------------------------------------------------------ the part


class SqlSignalBuffer:
    """Buffered signals, bounded buffered events, and their takes into checkpoints."""

    def __init__(
        self,
        runner: StatementRunner,
        statements: Statements,
        dialect: SqlDialect,
        *,
        clock: Callable[[], datetime],
    ) -> None:
        self._runner = runner
        self._q = statements
        self._dialect = dialect
        self._clock = clock

    def _now_ms(self) -> int:
        return _rows.ms(self._clock())

    async def buffer_signal(self, token: str, payload: JSONValue) -> None:
        params = {
            "token": token,
            "payload": _rows.json_or_null(payload),
            "namespace": token_namespace(token),
            "buffered_at": self._now_ms(),
            "expires_at": None,
        }
        await self._runner.write(self._q.buffer_signal, params)

    async def buffer_signal_bounded(
        self, token: str, payload: JSONValue, *, ttl_ms: int, per_token: int, per_namespace: int
    ) -> BufferScope | None:
        now = self._now_ms()
        params = {
            "token": token,
            "payload": _rows.json_or_null(payload),
            "namespace": token_namespace(token),
            "now": now,
            "expires_at": now + int(ttl_ms),
            "per_token": int(per_token),
            "per_ns": int(per_namespace),
        }
        if await self._runner.write(self._q.buffer_signal_bounded, params) == 1:
            return None
        # Refused (the cold path): say which cap. The token's own count decides; a row taken
        # between the two statements can only make this answer "namespace" too eagerly.
        live = await self._runner.read_scalar(
            self._q.count_token_signals, {"token": token, "now": now}, point=True
        )
        return "token" if live >= per_token else "namespace"

    async def peek_buffered_signals(self, token: str, limit: int) -> list[BufferedSignal]:
        params = {"token": token, "now": self._now_ms(), "lim": max(int(limit), 0)}
        found = await self._runner.read_all(self._q.peek_signals, params, point=True)
        return [BufferedSignal(payload=_rows.json_from_sql(row[0])) for row in found]

    async def _take_signal_text(self, s: Session, params: dict[str, Any]) -> Any:
        """Inside a transaction: delete the oldest live row of `params["token"]` and return
        its payload as stored (JSON text, or None for a NULL payload); `_MISS` when none."""
        if self._q.take_signal is not None:
            found = await self._runner.fetch(s, self._q.take_signal, params)
            return found[0][0] if found else _MISS
        found = await self._runner.fetch(s, self._q.oldest_signal, params)
        if not found:
            return _MISS
        signal_id, text = found[0]
        await self._runner.run(s, self._q.delete_signal, {"id": signal_id})
        return text

    async def take_buffered_signal_into(
        self, token: str, cp: StepCheckpoint, *, waiting: bool = False
    ) -> BufferedSignal | None:
        probe = {"token": token, "now": self._now_ms()}
        if not await self._runner.read_all(self._q.oldest_signal, probe, point=True):
            return None  # the common miss: one read, no transaction
        row = _rows.checkpoint_to_sql(cp)  # a payload that cannot be stored fails here
        key = {"run_id": cp.run_id, "seq": cp.seq}

        async def work(s: Session) -> BufferedSignal | None:
            held = await self._runner.fetch(s, self._q.lock_waiter, {"token": token})
            ours = bool(held) and (held[0][1], held[0][2]) == (cp.run_id, cp.seq)
            if waiting and not ours:
                return None  # a sender took our waiter: its delivery is on the way
            status = await self._runner.fetch(s, self._q.lock_cp_status, key)
            if status and status[0][0] == "completed":
                return None
            text = await self._take_signal_text(s, probe)
            if text is _MISS:
                return None
            if ours:
                await self._runner.run(s, self._q.remove_waiter, {"token": token, **key})
            await self._runner.run(s, self._q.save_cp, {**row, "output": text})
            return BufferedSignal(payload=_rows.json_from_sql(text))

        return await self._runner.transaction(work)

    async def deliver_buffered_signal(self, token: str, at: datetime) -> StepCheckpoint | None:
        params = {"token": token}
        if not await self._runner.read_all(self._q.get_waiter, params, point=True):
            return None  # the common case, nobody waits: one read, no transaction

        async def take(s: Session) -> Any:
            return await self._take_signal_text(s, {"token": token, "now": self._now_ms()})

        return await self._hand_to_waiter(token, take, at)

    async def _hand_to_waiter(
        self, token: str, take: Callable[[Session], Awaitable[Any]], at: datetime
    ) -> StepCheckpoint | None:
        """In ONE transaction: lock the token's waiter, take a buffered payload (`take`: its
        stored text, or `_MISS`), then remove the waiter and write its checkpoint holding that
        payload. None, and nothing changed, when either is missing."""
        params = {"token": token}

        async def work(s: Session) -> StepCheckpoint | None:
            held = await self._runner.fetch(s, self._q.lock_waiter, params)
            if not held:
                return None
            text = await take(s)
            if text is _MISS:
                return None
            await self._runner.run(s, self._q.delete_waiter, params)
            cp = delivered_signal(_rows.waiter_from_row(held[0]), None, at)
            await self._runner.run(
                s, self._q.save_cp, {**_rows.checkpoint_to_sql(cp), "output": text}
            )
            return replace(cp, output=_rows.json_from_sql(text))

        return await self._runner.transaction(work)

    # ------------------------------------------------------------------ buffered events

    async def buffer_event_bounded(
        self, event: BufferedEvent, *, ttl_ms: int, per_name: int, per_namespace: int
    ) -> BufferScope | None:
        since = int(event.published_at) - int(ttl_ms)
        params = {
            "id": event.id,
            "name": event.name,
            "payload": _rows.json_or_null(event.payload),
            "published_at": int(event.published_at),
            "since": since,
            "per_name": int(per_name),
            "per_ns": int(per_namespace),
        }
        if await self._runner.write(_INSERT_EVENT_BOUNDED, params) == 1:
            return None
        live = await self._runner.read_scalar(
            _COUNT_NAME_LIVE, {"name": event.name, "since": since}
        )
        return "token" if live >= per_name else "namespace"

    async def purge_expired_events(self, published_before_ms: int) -> int:
        return await self._runner.write(_PURGE_EVENTS, {"before": int(published_before_ms)})

    async def _take_event_text(self, s: Session, event_id: str) -> Any:
        """Inside a transaction: delete the buffered event and return its payload as stored;
        `_MISS` when it is gone. The delete decides: of two transactions that read the row,
        the one whose delete finds it gone (PostgreSQL re-checks it after the other commits)
        takes nothing."""
        found = await self._runner.fetch(s, self._q.event_payload, {"id": event_id})
        if not found:
            return _MISS
        if await self._runner.run(s, self._q.remove_event, {"id": event_id}) != 1:
            return _MISS
        return found[0][0]

    async def take_buffered_event_into(self, event_id: str, token: str, cp: StepCheckpoint) -> bool:
        row = _rows.checkpoint_to_sql(cp)  # a payload that cannot be stored fails here
        key = {"run_id": cp.run_id, "seq": cp.seq}

        async def work(s: Session) -> bool:
            held = await self._runner.fetch(s, self._q.lock_waiter, {"token": token})
            if not held or (held[0][1], held[0][2]) != (cp.run_id, cp.seq):
                return False  # a publisher took our waiter: its delivery is on the way
            status = await self._runner.fetch(s, self._q.lock_cp_status, key)
            if status and status[0][0] == "completed":
                return False
            text = await self._take_event_text(s, event_id)
            if text is _MISS:
                return False
            await self._runner.run(s, self._q.remove_waiter, {"token": token, **key})
            await self._runner.run(s, self._q.save_cp, {**row, "output": text})
            return True

        return await self._runner.transaction(work)

    async def deliver_buffered_event(
        self, event_id: str, token: str, at: datetime
    ) -> StepCheckpoint | None:

        async def take(s: Session) -> Any:
            return await self._take_event_text(s, event_id)

        return await self._hand_to_waiter(token, take, at)

    # ------------------------------------------------------------------ listing

    async def list_buffered_signals(
        self, *, prefix: str | None, limit: int, offset: int
    ) -> list[BufferedSignalInfo]:
        stmt = (
            sa.select(_bs.token, _size_bytes(self._dialect), _bs.buffered_at, _bs.expires_at)
            .where(*_prefix_where(self._dialect, prefix))
            .order_by(_bs.id)
            .limit(max(int(limit), 0))
            .offset(max(int(offset), 0))
        )
        return [
            BufferedSignalInfo(
                token=str(token),
                size_bytes=int(size or 0),
                buffered_at=utc_from_ms(int(buffered_at)) if buffered_at is not None else None,
                expires_at=utc_from_ms(int(expires_at)) if expires_at is not None else None,
            )
            for token, size, buffered_at, expires_at in await self._runner.read_all(stmt)
        ]

    async def count_buffered_signals(self, *, prefix: str | None = None) -> int:
        stmt = (
            sa.select(sa.func.count())
            .select_from(buffered_signals)
            .where(*_prefix_where(self._dialect, prefix))
        )
        return await self._runner.read_scalar(stmt)

    async def purge_buffered_signals(
        self, *, token: str | None = None, prefix: str | None = None, expired_only: bool = False
    ) -> int:
        where: list[sa.ColumnElement[bool]] = [_bs.expires_at.is_not(None)]
        if token is not None:
            where.append(_bs.token == token)
        else:
            where.extend(_prefix_where(self._dialect, prefix))
        if expired_only:
            where.append(_bs.expires_at <= self._now_ms())
        return await self._runner.write(sa.delete(buffered_signals).where(*where))


__all__ = ["SqlSignalBuffer", "migration_v3"]
