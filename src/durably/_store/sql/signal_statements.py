"""The prebuilt statements of the signal buffer (`SignalBufferStatements`).

A leaf of the SQL store's statements: `statements.py` keeps them, `signal_buffer.py` runs
them.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import bindparam

from durably._store.sql.dialect import SqlDialect
from durably._store.sql.schema import buffered_signals, checkpoints, waiters

_bs = buffered_signals.c


def _live(now: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    return sa.or_(_bs.expires_at.is_(None), _bs.expires_at > now)


def _live_count_below(
    column: sa.ColumnElement[str], value: str, cap: str
) -> sa.ColumnElement[bool]:
    """`(SELECT count(*) FROM (SELECT 1 … WHERE column = :value AND live LIMIT :cap)) < :cap`:
    reads at most `cap` index entries however many rows are buffered."""
    now = bindparam("now", type_=sa.BigInteger)
    limit = bindparam(cap, type_=sa.Integer)
    rows = (
        sa.select(sa.literal(1).label("one"))
        .select_from(buffered_signals)
        .where(column == bindparam(value, type_=sa.Text), _live(now))
        .limit(limit)
        .subquery()
    )
    counted = sa.select(sa.func.count()).select_from(rows).scalar_subquery()
    return counted < limit


class SignalBufferStatements:
    """Builds the prebuilt statements of the signal buffer; `Statements` keeps them (as
    `buffer_signal`, `buffer_signal_bounded`, `count_token_signals`, `oldest_signal`,
    `peek_signals`, `delete_signal`, `take_signal`, `lock_waiter`, `lock_cp_status`) and
    registers them with the connector, so SQLite runs each in one call and PostgreSQL prepares
    it once."""

    def __init__(self, dialect: SqlDialect) -> None:
        now = bindparam("now", type_=sa.BigInteger)
        columns = ["token", "payload", "namespace", "buffered_at", "expires_at"]
        self.insert = sa.insert(buffered_signals)
        values = sa.select(
            sa.cast(bindparam("token", type_=sa.Text), sa.Text),
            sa.cast(bindparam("payload", type_=sa.Text), sa.Text),
            sa.cast(bindparam("namespace", type_=sa.Text), sa.Text),
            sa.cast(bindparam("now", type_=sa.BigInteger), sa.BigInteger),
            sa.cast(bindparam("expires_at", type_=sa.BigInteger), sa.BigInteger),
        ).where(
            _live_count_below(_bs.token, "token", "per_token"),
            _live_count_below(_bs.namespace, "namespace", "per_ns"),
        )
        self.insert_bounded = sa.insert(buffered_signals).from_select(columns, values)
        self.count_token_live = (
            sa.select(sa.func.count())
            .select_from(buffered_signals)
            .where(_bs.token == bindparam("token", type_=sa.Text), _live(now))
        )
        oldest = (
            sa.select(_bs.id)
            .where(_bs.token == bindparam("token", type_=sa.Text), _live(now))
            .order_by(_bs.id)
            .limit(1)
        )
        # Without RETURNING (SQLite < 3.35): read the oldest live row, then delete it by id.
        self.oldest = (
            sa.select(_bs.id, _bs.payload)
            .where(_bs.token == bindparam("token", type_=sa.Text), _live(now))
            .order_by(_bs.id)
            .limit(1)
        )
        self.delete_by_id = sa.delete(buffered_signals).where(_bs.id == bindparam("id"))
        self.peek = (
            sa.select(_bs.payload)
            .where(_bs.token == bindparam("token", type_=sa.Text), _live(now))
            .order_by(_bs.id)
            .limit(bindparam("lim", type_=sa.Integer))
        )
        # The rows a consumption changes besides the buffered one, locked in this order
        # (PostgreSQL; SQLite runs one writer at a time): the token's waiter, then the
        # checkpoint at the wait's seq.
        w, c = waiters.c, checkpoints.c
        lock_waiter = sa.select(w.token, w.run_id, w.seq, w.parallel_group).where(
            w.token == bindparam("token", type_=sa.Text)
        )
        cp_status = sa.select(c.status).where(
            c.run_id == bindparam("run_id", type_=sa.Text),
            c.seq == bindparam("seq", type_=sa.Integer),
        )
        if not dialect.is_sqlite:
            lock_waiter = lock_waiter.with_for_update()
            cp_status = cp_status.with_for_update()
        self.lock_waiter = lock_waiter
        self.cp_status = cp_status
        if dialect.supports_returning:
            if not dialect.is_sqlite:
                # Two concurrent takers get two different rows instead of one of them
                # finding nothing.
                oldest = oldest.with_for_update(skip_locked=True)
            self.take: sa.Executable | None = (
                sa.delete(buffered_signals)
                .where(_bs.id == oldest.scalar_subquery())
                .returning(_bs.payload)
            )
        else:
            self.take = None


__all__ = ["SignalBufferStatements"]
