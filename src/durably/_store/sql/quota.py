"""Workflow start admission of the SQL store (the contract is written on
`durably._store.protocol.StateStore`): gated starts, singleton admission and its wake-ups.

Each call is ONE transaction. On PostgreSQL it first takes a transaction-scoped advisory
lock per key (`pg_advisory_xact_lock`), so two starts or two admissions of the same key
queue behind each other and the second one's statements (READ COMMITTED: a fresh snapshot
per statement) see the first one's commit: the count and the insert it allows are atomic,
across every process sharing the database. On SQLite the transaction holds the database's
write lock (`BEGIN IMMEDIATE`), which serialises the same way.

Runs are counted through the tag index (`durable_run_tags (tag, run_id)`); a singleton
holder is a run that also carries the admission marker tag.

A part object of `SqlStateStore` (which forwards the four contract methods to it), given
what it uses: the store's `StatementRunner`, its prebuilt `Statements` (the run insert a
gated start shares with `create_run`), its `SqlDialect`, its clock, and its `get_run` (to
tell an idempotent start from a conflicting one after a lost race).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import bindparam

from durably._core.models import LIVE_RUN_STATUSES, WorkflowRun
from durably._core.quota import (
    SINGLETON_ACTIVE_STATUSES,
    SINGLETON_ADMITTED_TAG,
    StartGate,
    StartOutcome,
    singleton_admits,
    singleton_line,
    singleton_lock_key,
)
from durably._store.sql import rows as _rows
from durably._store.sql.connection import Session
from durably._store.sql.dialect import SqlDialect
from durably._store.sql.runner import StatementRunner
from durably._store.sql.schema import run_dedup, runs, tags
from durably._store.sql.statements import Statements

Row = Sequence[Any]

_r, _t, _d = runs.c, tags.c, run_dedup.c
_bp = bindparam

_LOCK = sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtextextended(_bp("k"), 0)))
_RUN = sa.select(_r.workflow, _r.status, _r.tags).where(_r.id == _bp("id"))
_DEDUP_HOLDER = (
    sa.select(_r.id, _r.status)
    .select_from(run_dedup.join(runs, _r.id == _d.run_id))
    .where(_d.dedup_key == _bp("k"))
)
_DELETE_DEDUP = sa.delete(run_dedup).where(_d.dedup_key == _bp("k"))
_INSERT_DEDUP = sa.insert(run_dedup)
_INSERT_TAG = sa.insert(tags)
_SET_TAGS = sa.update(runs).where(_r.id == _bp("w_id")).values(tags=_bp("tags"))
_HOLDS = (
    sa.exists()
    .where(_t.run_id == _r.id, _t.tag == sa.literal(SINGLETON_ADMITTED_TAG))
    .correlate(runs)
)
# The key's active runs in creation order, each with whether it holds a slot.
_SINGLETON_LINE = (
    sa.select(_r.id, _r.status, _HOLDS)
    .select_from(tags.join(runs, _r.id == _t.run_id))
    .where(
        _t.tag == _bp("tag"),
        _r.workflow == _bp("wf"),
        _r.status.in_([sa.literal(s) for s in SINGLETON_ACTIVE_STATUSES]),
    )
    .order_by(_r.created_at, _r.id)
)
_DENY = (
    sa.update(runs)
    .where(
        _r.id == _bp("w_id"),
        _r.status.in_([sa.literal(s) for s in SINGLETON_ACTIVE_STATUSES if s != "cancelling"]),
    )
    .values(
        status="suspended",
        wake_at=_bp("wake_at"),
        locked_by=None,
        locked_until=None,
        updated_at=_bp("now"),
    )
)
_WAKE = (
    sa.update(runs)
    .where(_r.id == _bp("w_id"), _r.status == "suspended")
    .values(wake_at=_bp("wake_at"))
)


def _count_tagged(statuses: Sequence[str], by_workflow: bool) -> sa.Select[Any]:
    where = [_t.tag == _bp("tag"), _r.status.in_([sa.literal(s) for s in statuses])]
    if by_workflow:
        where.append(_r.workflow == _bp("wf"))
    return sa.select(sa.func.count()).select_from(tags.join(runs, _r.id == _t.run_id)).where(*where)


class SqlStartAdmission:
    """Gated starts and singleton admission, each ONE transaction."""

    def __init__(
        self,
        runner: StatementRunner,
        statements: Statements,
        dialect: SqlDialect,
        *,
        clock: Callable[[], datetime],
        get_run: Callable[[str], Awaitable[WorkflowRun | None]],
    ) -> None:
        self._runner = runner
        self._q = statements
        self._dialect = dialect
        self._clock = clock
        self._get_run = get_run

    async def _lock(self, s: Session, keys: Sequence[str]) -> None:
        """PostgreSQL: serialise on each key until the transaction ends (SQLite's write lock
        already does)."""
        if self._dialect.is_sqlite:
            return
        for key in keys:
            await self._runner.fetch(s, _LOCK, {"k": key})

    async def _count(
        self, s: Session, tag: str, statuses: Sequence[str], workflow: str | None
    ) -> int:
        params: dict[str, Any] = {"tag": tag}
        if workflow is not None:
            params["wf"] = workflow
        found = await self._runner.fetch(s, _count_tagged(statuses, workflow is not None), params)
        return int(found[0][0] or 0) if found else 0

    async def create_run_gated(self, run: WorkflowRun, gate: StartGate) -> StartOutcome:
        params = _rows.run_to_sql(run)
        attr_rows = _rows.attribute_rows(run.id, run.search_attributes)
        tag_rows = _rows.tag_rows(run.id, run.tags)

        async def work(s: Session) -> StartOutcome:
            await self._lock(s, gate.lock_keys)
            found = await self._runner.fetch(s, _RUN, {"id": run.id})
            if found:
                return StartOutcome("exists", holder=str(found[0][0]))
            if gate.dedup_key is not None:
                holder = await self._runner.fetch(s, _DEDUP_HOLDER, {"k": gate.dedup_key})
                if holder and holder[0][1] in LIVE_RUN_STATUSES:
                    return StartOutcome("duplicate", holder=str(holder[0][0]))
            refused = await self._check_capacity(s, gate)
            if refused is not None:
                return refused
            await self._runner.run(s, self._q.insert_run, params)
            if tag_rows:
                await self._runner.many(s, self._q.insert_tags, tag_rows)
            if attr_rows:
                await self._runner.many(s, self._q.insert_attrs, attr_rows)
            if gate.dedup_key is not None:
                await self._runner.run(s, _DELETE_DEDUP, {"k": gate.dedup_key})
                await self._runner.run(
                    s, _INSERT_DEDUP, {"dedup_key": gate.dedup_key, "run_id": run.id}
                )
            return StartOutcome("created")

        try:
            outcome: StartOutcome = await self._runner.transaction(work)
        except sa.exc.IntegrityError:
            # Another start inserted the same run id between our check and our insert (its
            # keys differ from ours, so no lock ordered the two): an idempotent start.
            existing = await self._get_run(run.id)
            if existing is None:
                raise
            return StartOutcome("exists", holder=existing.workflow)
        return outcome

    async def gate_untagged_run(
        self, run_id: str, new_tags: Sequence[str], gate: StartGate
    ) -> StartOutcome:
        async def work(s: Session) -> StartOutcome:
            await self._lock(s, gate.lock_keys)
            found = await self._runner.fetch(s, _RUN, {"id": run_id})
            if not found or found[0][1] != "pending":
                return StartOutcome("exists", holder=str(found[0][0]) if found else None)
            outcome = await self._check_capacity(s, gate)
            if outcome is not None:
                return outcome
            current = list(_rows.tags_from_sql(found[0][2]) or ())
            for tag in new_tags:
                if tag not in current:
                    current = await self._add_tag(s, run_id, current, tag)
            return StartOutcome("created")

        return await self._runner.transaction(work)

    async def _check_capacity(self, s: Session, gate: StartGate) -> StartOutcome | None:
        """The singleton depth and the quota of `gate` (inside its transaction, under its
        locks); None when both leave room."""
        if gate.singleton_tag is not None and gate.singleton_capacity is not None:
            active = await self._count(
                s, gate.singleton_tag, SINGLETON_ACTIVE_STATUSES, gate.singleton_workflow
            )
            if active >= gate.singleton_capacity:
                return StartOutcome("singleton_full", active=active)
        if gate.quota_tag is not None:
            if gate.quota_limit <= 0:
                return StartOutcome("quota_full", active=0)
            active = await self._count(s, gate.quota_tag, gate.quota_statuses, None)
            if active >= gate.quota_limit:
                return StartOutcome("quota_full", active=active)
        return None

    async def _line(self, s: Session, tag: str, workflow: str) -> list[tuple[str, str, bool]]:
        found = await self._runner.fetch(s, _SINGLETON_LINE, {"tag": tag, "wf": workflow})
        return [(str(row[0]), str(row[1]), bool(row[2])) for row in found]

    async def _add_tag(self, s: Session, run_id: str, current: list[str], tag: str) -> list[str]:
        tags_now = [*current, tag]
        await self._runner.run(s, _SET_TAGS, {"w_id": run_id, "tags": _rows.tags_to_sql(tags_now)})
        await self._runner.run(s, _INSERT_TAG, {"run_id": run_id, "tag": tag})
        return tags_now

    async def try_admit_singleton(
        self, run_id: str, tag: str, workflow: str, limit: int, retry_wake_at_ms: int
    ) -> bool:
        now = _rows.ms(self._clock())

        async def work(s: Session) -> bool:
            await self._lock(s, [singleton_lock_key(workflow, tag)])
            found = await self._runner.fetch(s, _RUN, {"id": run_id})
            if not found or found[0][1] not in SINGLETON_ACTIVE_STATUSES:
                return False
            status = str(found[0][1])
            current = list(_rows.tags_from_sql(found[0][2]) or ())
            if tag not in current:
                # A run created without its key's tag (a fan member, a start by name from a
                # process without the workflow's code) joins the line at its first turn.
                current = await self._add_tag(s, run_id, current, tag)
            if singleton_admits(run_id, await self._line(s, tag, workflow), limit):
                if SINGLETON_ADMITTED_TAG not in current:
                    await self._add_tag(s, run_id, current, SINGLETON_ADMITTED_TAG)
                return True
            if status != "cancelling":
                await self._runner.run(
                    s, _DENY, {"w_id": run_id, "wake_at": retry_wake_at_ms, "now": now}
                )
            return False

        return bool(await self._runner.transaction(work))

    async def wake_singleton_waiters(
        self, tag: str, workflow: str, limit: int, now_ms: int
    ) -> list[str]:
        async def work(s: Session) -> list[str]:
            await self._lock(s, [singleton_lock_key(workflow, tag)])
            _, nxt = singleton_line(await self._line(s, tag, workflow), limit)
            for run_id in nxt:
                await self._runner.run(s, _WAKE, {"w_id": run_id, "wake_at": now_ms})
            return nxt

        return await self._runner.transaction(work)
