"""The SQL store's prebuilt statements: built once per store, with named bind parameters.

Registered with the connector (`Statements.prebuilt`): on SQLite each runs in ONE aiosqlite
call with SQL compiled once; on PostgreSQL SQLAlchemy's compiled cache and asyncpg's prepared
statements make each one a single Bind/Execute round trip. Scans and claims come in three
namespace shapes: no namespace, `'default'` (legacy NULLs included), other.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import bindparam

from durably._store.sql.dialect import SqlDialect
from durably._store.sql.schema import (
    CHECKPOINT_COLUMNS,
    PICKUP_PRIORITY,
    RUN_COLUMNS,
    attributes,
    buffered_events,
    checkpoints,
    runs,
    tags,
    waiters,
)
from durably._store.sql.signal_statements import SignalBufferStatements
from durably._store.sql.stats_statements import checkpoint_stats_statements

WAITER_COLUMNS = (waiters.c.token, waiters.c.run_id, waiters.c.seq, waiters.c.parallel_group)
EVENT_COLUMNS = (
    buffered_events.c.id,
    buffered_events.c.name,
    buffered_events.c.payload,
    buffered_events.c.published_at,
)
INCOMPLETE_STATUSES = ("running", "cancelling")
CP_KEYS = ("run_id", "seq")
# The pick-up order of pending runs: higher priority first (a run without one counts as 0),
# then oldest. Written exactly as the pick-up index declares it, so SQLite and PostgreSQL walk
# that index instead of sorting the backlog.
PICKUP_ORDER = (PICKUP_PRIORITY.desc(), runs.c.created_at, runs.c.id)


class Statements:
    """Every prebuilt statement of one store (attributes; tuples hold namespace variants)."""

    def __init__(self, dialect: SqlDialect) -> None:
        self.dialect = d = dialect
        r, c, w = runs.c, checkpoints.c, waiters.c
        bp = bindparam

        self.insert_run = sa.insert(runs)
        self.get_run = sa.select(*RUN_COLUMNS).where(r.id == bp("id"))
        self.update_run = sa.update(runs).where(r.id == bp("w_id"))
        self.delete_run_rows = (
            sa.delete(checkpoints).where(c.run_id == bp("run_id")),
            sa.delete(waiters).where(w.run_id == bp("run_id")),
            sa.delete(attributes).where(attributes.c.run_id == bp("run_id")),
            sa.delete(tags).where(tags.c.run_id == bp("run_id")),
            sa.delete(runs).where(r.id == bp("run_id")),
        )
        self.insert_tags = sa.insert(tags)
        self.insert_attrs = sa.insert(attributes)
        self.delete_tags = sa.delete(tags).where(tags.c.run_id == bp("run_id"))
        self.delete_attrs = sa.delete(attributes).where(attributes.c.run_id == bp("run_id"))

        # checkpoints
        self.get_cp = sa.select(*CHECKPOINT_COLUMNS).where(
            c.run_id == bp("run_id"), c.seq == bp("seq")
        )
        self.save_cp = d.upsert(checkpoints, CP_KEYS)
        self.cas_cp = sa.update(checkpoints).where(
            c.run_id == bp("w_run_id"), c.seq == bp("w_seq"), c.status == "pending"
        )
        self.pending_keys = (
            sa.select(c.run_id, c.seq)
            .where(d.in_pairs(c.run_id, c.seq, "keys"), c.status == "pending")
            .with_for_update()
        )
        self.list_cps = (
            sa.select(*CHECKPOINT_COLUMNS).where(c.run_id == bp("run_id")).order_by(c.seq)
        )
        self.latest_cp = (
            sa.select(*CHECKPOINT_COLUMNS)
            .where(c.run_id == bp("run_id"), c.name == bp("name"))
            .order_by(c.seq.desc())
            .limit(1)
        )
        self.count_cps = sa.select(sa.func.count()).where(
            c.run_id == bp("run_id"),
            c.seq >= bp("lo"),
            c.seq <= bp("hi"),
            d.in_list(c.status, "statuses"),
        )

        # pick-up scans, one statement per namespace shape (none / 'default' / other)
        self.incomplete = _scan_variants(
            sa.or_(*(r.status == status for status in INCOMPLETE_STATUSES)),
            order=(r.created_at, r.id),
        )
        # `blocked` runs (no live worker could take their next step) are re-checked on
        # the same clock as suspended ones.
        # (An OR of two equalities, not IN: IN compiles to an expanding parameter, which
        # would take this hot statement off the driver's one-call path.)
        due = (
            sa.or_(r.status == "suspended", r.status == "blocked"),
            r.wake_at.is_not(None),
            r.wake_at <= bp("now"),
        )
        self.due = _scan_variants(*due, order=(r.wake_at, r.id))
        self.due_limited = _scan_variants(*due, order=(r.wake_at, r.id), limited=True)
        orphaned = (
            r.status == "suspended",
            r.locked_by.is_not(None),
            r.locked_until <= bp("now"),
        )
        self.orphaned = _scan_variants(*orphaned, order=(r.locked_until, r.id), limited=True)

        # leases
        lockable = sa.and_(
            r.id == bp("w_id"),
            sa.or_(r.locked_until.is_(None), r.locked_until <= bp("w_now")),
        )
        self.try_lock = (
            sa.update(runs)
            .where(lockable)
            .values(locked_by=bp("w_owner"), locked_until=bp("w_until"))
        )
        self.claim = self.try_lock.returning(*RUN_COLUMNS) if d.supports_returning else None
        self.release = (
            sa.update(runs).where(r.id == bp("w_id")).values(locked_by=None, locked_until=None)
        )
        self.renew_all = (
            sa.update(runs).where(r.locked_by == bp("w_owner")).values(locked_until=bp("w_until"))
        )
        self.release_all = (
            sa.update(runs)
            .where(r.locked_by == bp("w_owner"))
            .values(locked_by=None, locked_until=None)
        )

        # claim pending runs (SupportsClaimPending), one statement per namespace shape
        self.claim_pending = _claim_variants(d)
        self.current_schema = sa.select(sa.func.current_schema())
        self.notify = sa.select(
            sa.func.pg_notify(bp("channel", type_=sa.Text), bp("payload", type_=sa.Text))
        )

        # waiters
        order = (w.run_id, w.seq, w.token)
        self.put_waiter = d.upsert(waiters, ("token",))
        self.get_waiter = sa.select(*WAITER_COLUMNS).where(w.token == bp("token"))
        self.delete_waiter = sa.delete(waiters).where(w.token == bp("token"))
        self.all_waiters = sa.select(*WAITER_COLUMNS).order_by(*order)
        self.waiters_plain = (
            sa.select(*WAITER_COLUMNS)
            .where(d.prefix_predicate(w.token, ranged=False))
            .order_by(*order)
        )
        self.waiters_ranged = (
            sa.select(*WAITER_COLUMNS)
            .where(d.prefix_predicate(w.token, ranged=True))
            .order_by(*order)
        )
        self.remove_waiter = sa.delete(waiters).where(
            w.token == bp("token"), w.run_id == bp("run_id"), w.seq == bp("seq")
        )

        # buffered signals (bounded; built by sql/signal_statements.py) and events
        sb = SignalBufferStatements(d)
        self.buffer_signal = sb.insert
        self.buffer_signal_bounded = sb.insert_bounded
        self.count_token_signals = sb.count_token_live
        self.oldest_signal = sb.oldest
        self.peek_signals = sb.peek
        self.delete_signal = sb.delete_by_id
        self.take_signal = sb.take
        self.lock_waiter = sb.lock_waiter
        self.lock_cp_status = sb.cp_status
        be = buffered_events.c
        self.buffer_event = sa.insert(buffered_events)
        self.list_events = (
            sa.select(*EVENT_COLUMNS)
            .where(be.name == bp("name"))
            .order_by(be.published_at, be.id)
            .limit(bp("lim", type_=sa.Integer))
        )
        self.remove_event = sa.delete(buffered_events).where(be.id == bp("id"))
        self.event_payload = sa.select(be.payload).where(be.id == bp("id"))

        # bulk operations of fans (bulk.py): multi-row writes and list lookups
        self.insert_cp_ignore = d.insert_ignore(checkpoints, CP_KEYS)
        self.insert_run_ignore = d.insert_ignore(runs, ("id",))
        self.insert_tags_ignore = d.insert_ignore(tags, ("run_id", "tag"))
        self.existing_runs = sa.select(r.id, r.workflow).where(d.in_list(r.id, "ids"))
        self.waiters_in = sa.select(*WAITER_COLUMNS).where(d.in_list(w.token, "tokens"))
        self.delete_waiters_in = sa.delete(waiters).where(d.in_list(w.token, "tokens"))
        claimable_ids = (
            d.in_list(r.id, "ids"),
            r.status == "pending",
            sa.or_(r.locked_until.is_(None), r.locked_until <= bp("w_now")),
        )
        self.claim_ids_pick = sa.select(*RUN_COLUMNS).where(*claimable_ids)
        self.claim_ids = (
            sa.update(runs)
            .where(*claimable_ids)
            .values(locked_by=bp("w_owner"), locked_until=bp("w_until"))
            .returning(*RUN_COLUMNS)
            if d.supports_returning
            else None
        )
        self.delete_cp_range = sa.delete(checkpoints).where(
            c.run_id == bp("run_id"), c.seq >= bp("lo"), c.seq <= bp("hi")
        )
        self.take_waiters_in = (
            self.delete_waiters_in.returning(*WAITER_COLUMNS) if d.supports_returning else None
        )

        # ---- checkpoint aggregates — built by sql/stats_statements.py, run by sql/aggregates.py
        # `checkpoint_stats`: one GROUP BY, every group / one group (binds run_id[, group]).
        self.cp_stats, self.cp_stats_group = checkpoint_stats_statements(d)

    def prebuilt(self) -> list[Any]:
        out: list[Any] = []
        for name, value in vars(self).items():
            if name != "dialect":
                out.extend(value if isinstance(value, tuple) else (value,))
        return [stmt for stmt in out if stmt is not None]


def _scan_variants(
    *preds: sa.ColumnElement[bool],
    order: tuple[sa.ColumnElement[Any], ...],
    limited: bool = False,
) -> tuple[sa.Select[Any], sa.Select[Any], sa.Select[Any]]:
    """(no namespace, 'default' incl. legacy NULLs, any other namespace)."""
    ns = runs.c.namespace
    shapes: list[tuple[sa.ColumnElement[bool], ...]] = [
        (),
        (sa.or_(ns == bindparam("ns"), ns.is_(None)),),
        (ns == bindparam("ns"),),
    ]
    out = []
    for extra in shapes:
        stmt = sa.select(*RUN_COLUMNS).where(*preds, *extra).order_by(*order)
        if limited:
            stmt = stmt.limit(bindparam("lim", type_=sa.Integer))
        out.append(stmt)
    return out[0], out[1], out[2]


def _claim_variants(dialect: SqlDialect) -> tuple[sa.Executable, sa.Executable, sa.Executable]:
    """`UPDATE … SET locked_by, locked_until WHERE id IN (first claimable pending ids in
    pick-up order LIMIT :lim [FOR UPDATE SKIP LOCKED]) RETURNING *` for (no namespace,
    'default', other). Without RETURNING (SQLite < 3.35) the SELECT of the candidates
    instead."""
    r = runs.c
    ns = r.namespace
    shapes: list[tuple[sa.ColumnElement[bool], ...]] = [
        (),
        (sa.or_(ns == bindparam("ns"), ns.is_(None)),),
        (ns == bindparam("ns"),),
    ]
    claimable = (
        r.status == "pending",
        sa.or_(r.locked_until.is_(None), r.locked_until <= bindparam("w_now")),
    )
    out: list[sa.Executable] = []
    for extra in shapes:
        columns = (r.id,) if dialect.supports_returning else RUN_COLUMNS
        pick = (
            sa.select(*columns)
            .where(*claimable, *extra)
            .order_by(*PICKUP_ORDER)
            .limit(bindparam("lim", type_=sa.Integer))
        )
        if not dialect.is_sqlite:
            pick = pick.with_for_update(skip_locked=True)
        if not dialect.supports_returning:
            out.append(pick)
            continue
        # PostgreSQL: `id = ANY(ARRAY(pick))`, not `id IN (pick)`: with LIMIT a bind
        # parameter, the generic plan of the IN form hash-joins a sequential scan of every
        # run (O(N) per claim, O(N²) for a wide child fan); this form is an InitPlan plus
        # primary-key lookups.
        target = (
            r.id.in_(pick)
            if dialect.is_sqlite
            else r.id == sa.any_(sa.func.array(pick.scalar_subquery()))
        )
        out.append(
            sa.update(runs)
            .where(target)
            .values(locked_by=bindparam("w_owner"), locked_until=bindparam("w_until"))
            .returning(*RUN_COLUMNS)
        )
    return out[0], out[1], out[2]


__all__ = [
    "CP_KEYS",
    "EVENT_COLUMNS",
    "INCOMPLETE_STATUSES",
    "PICKUP_ORDER",
    "WAITER_COLUMNS",
    "Statements",
]
