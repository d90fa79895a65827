"""`prune_terminal_runs` on SQLite and PostgreSQL: one bounded batch per call.

A batch is one transaction: the SELECT of up to `limit` candidate ids (oldest first: those
older than `max_age`, then those beyond the `max_count` most recent; both walk the
`(status, updated_at)` index), then ONE DELETE per table over that id list. The runs DELETE
comes first and repeats the whole predicate with `RETURNING id`, so a run retried or given a
live child between the SELECT and the DELETE is kept, and only the runs actually deleted
lose their side rows. A finished parent whose child (tagged `durable:parent:<id>`) is still
live is never a candidate, so no live child loses its parent.

Side tables: checkpoints, signal waiters, attribute rows, tag rows and start dedup rows.
Buffered signals and events are keyed by token or name, not by run, and stay (they expire by
the signal buffer's own bounds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from durably._core.models import TERMINAL_RUN_STATUSES
from durably._core.retention import PARENT_TAG_PREFIX, RetentionPolicy
from durably._store.sql.connection import Session
from durably._store.sql.runner import StatementRunner
from durably._store.sql.schema import attributes, checkpoints, run_dedup, runs, tags, waiters

__all__ = ["SqlRetention", "run_side_deletes"]

_r = runs.c


def run_side_deletes(ids: Sequence[str]) -> list[sa.Delete]:
    """The DELETEs of every row belonging to the listed runs but the run rows themselves."""
    return [
        sa.delete(checkpoints).where(checkpoints.c.run_id.in_(ids)),
        sa.delete(waiters).where(waiters.c.run_id.in_(ids)),
        sa.delete(attributes).where(attributes.c.run_id.in_(ids)),
        sa.delete(tags).where(tags.c.run_id.in_(ids)),
        sa.delete(run_dedup).where(run_dedup.c.run_id.in_(ids)),
    ]


def _no_live_child() -> sa.ColumnElement[bool]:
    child = runs.alias("child")
    t = tags.alias("parent_tag")
    return ~sa.exists(
        sa.select(sa.literal(1))
        .select_from(t.join(child, child.c.id == t.c.run_id))
        .where(
            t.c.tag == sa.literal(PARENT_TAG_PREFIX) + _r.id,
            child.c.status.not_in(TERMINAL_RUN_STATUSES),
        )
    )


def _candidates(policy: RetentionPolicy, now_ms: int, limit: int) -> list[sa.Select[Any]]:
    base = (_r.status.in_(policy.statuses), _no_live_child())
    found: list[sa.Select[Any]] = []
    if policy.max_age_ms is not None:
        found.append(
            sa.select(_r.id)
            .where(*base, _r.updated_at < now_ms - policy.max_age_ms)
            .order_by(_r.updated_at, _r.id)
            .limit(limit)
        )
    if policy.max_count is not None:
        found.append(
            sa.select(_r.id)
            .where(*base)
            .order_by(_r.updated_at.desc(), _r.id.desc())
            .offset(policy.max_count)
            .limit(limit)
        )
    return found


class SqlRetention:
    """The SQL store's retention batches (see the module doc)."""

    def __init__(self, runner: StatementRunner) -> None:
        self._runner = runner

    async def prune_terminal_runs(
        self, policy: RetentionPolicy, now_ms: int, limit: int, *, dry_run: bool = False
    ) -> list[str]:
        if limit <= 0:
            return []

        async def select(s: Session) -> list[str]:
            chosen: dict[str, None] = {}
            for i, stmt in enumerate(_candidates(policy, now_ms, limit)):
                if len(chosen) >= limit:
                    break
                rows = [str(row[0]) for row in await self._runner.fetch(s, stmt)]
                # by age: oldest first already; beyond the count: newest first, so reversed
                for run_id in rows if i == 0 and policy.max_age_ms is not None else rows[::-1]:
                    chosen.setdefault(run_id, None)
            return list(chosen)[:limit]

        if dry_run:
            return await self._runner.cx.read(select)

        async def work(s: Session) -> list[str]:
            ids = await select(s)
            if not ids:
                return []
            delete_runs = (
                sa.delete(runs)
                .where(_r.id.in_(ids), _r.status.in_(policy.statuses), _no_live_child())
                .returning(_r.id)
            )
            gone = {str(row[0]) for row in await self._runner.fetch(s, delete_runs)}
            if gone:
                kept = [run_id for run_id in ids if run_id in gone]
                for stmt in run_side_deletes(kept):
                    await self._runner.run(s, stmt)
            return [run_id for run_id in ids if run_id in gone]

        return await self._runner.transaction(work)
