"""Multi-row operations of the SQL store, used by fans.

A fan of N members must cost O(N / batch) round trips, not O(N): these methods take a list
and write it with one `executemany` (or look it up with one `IN` list) per chunk, inside
one transaction where the contract asks for atomicity. The in-memory reference store
implements the same contracts.

A part object of `SqlStateStore` (which forwards the contract methods to it), given what it
uses and nothing else: the store's `StatementRunner` (every statement runs and is counted
there), its prebuilt `Statements` and its `SqlDialect`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from durably._core.models import (
    ChildWait,
    JSONValue,
    SignalWaiter,
    StepCheckpoint,
    WorkflowRun,
    delivered_signal,
)
from durably._store.protocol import BULK_CHUNK
from durably._store.sql import rows as _rows
from durably._store.sql.connection import Session
from durably._store.sql.dialect import SqlDialect
from durably._store.sql.runner import StatementRunner
from durably._store.sql.statements import Statements


def _chunks(items: Sequence[Any], size: int = BULK_CHUNK) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class BulkOps:
    """The multi-row contract methods, each a few statements per chunk of `BULK_CHUNK`."""

    def __init__(self, runner: StatementRunner, statements: Statements, dialect: SqlDialect):
        self._runner = runner
        self._q = statements
        self._dialect = dialect

    async def register_child_waits(self, waits: Sequence[ChildWait]) -> None:
        if not waits:
            return
        waiter_rows = [
            {
                "token": w.waiter.token,
                "run_id": w.waiter.run_id,
                "seq": w.waiter.seq,
                "parallel_group": w.waiter.parallel_group,
            }
            for w in waits
        ]
        placeholders = [_rows.checkpoint_to_sql(w.placeholder) for w in waits if w.placeholder]

        async def work(s: Session) -> None:
            for chunk in _chunks(waiter_rows):
                await self._runner.many(s, self._q.put_waiter, list(chunk))
            for chunk in _chunks(placeholders):
                await self._runner.many(s, self._q.insert_cp_ignore, list(chunk))

        await self._runner.transaction(work)

    async def create_runs(self, new_runs: Sequence[WorkflowRun]) -> list[str | None]:
        if not new_runs:
            return []
        ids = [run.id for run in new_runs]

        async def work(s: Session) -> list[str | None]:
            existing: dict[str, str] = {}
            for chunk in _chunks(ids):
                params = {"ids": self._dialect.list_value(chunk)}
                for row in await self._runner.fetch(s, self._q.existing_runs, params):
                    existing[str(row[0])] = str(row[1])
            fresh = [run for run in new_runs if run.id not in existing]
            tag_rows = [row for run in fresh for row in _rows.tag_rows(run.id, run.tags)]
            attr_rows = [
                row for run in fresh for row in _rows.attribute_rows(run.id, run.search_attributes)
            ]
            for chunk in _chunks([_rows.run_to_sql(run) for run in fresh]):
                await self._runner.many(s, self._q.insert_run_ignore, list(chunk))
            for chunk in _chunks(tag_rows):
                await self._runner.many(s, self._q.insert_tags_ignore, list(chunk))
            for chunk in _chunks(attr_rows):
                await self._runner.many(s, self._q.insert_attrs, list(chunk))
            return [existing.get(run_id) for run_id in ids]

        return await self._runner.transaction(work)

    async def deliver_signals(
        self, payloads: Sequence[tuple[str, JSONValue]], at: datetime
    ) -> list[StepCheckpoint]:
        if not payloads:
            return []
        by_token = dict(payloads)  # a later payload for the same token wins
        tokens = list(by_token)

        async def work(s: Session) -> list[StepCheckpoint]:
            taken: list[SignalWaiter] = []
            for chunk in _chunks(tokens):
                params = {"tokens": self._dialect.list_value(chunk)}
                if self._q.take_waiters_in is not None:
                    found = await self._runner.fetch(s, self._q.take_waiters_in, params)
                else:
                    found = await self._runner.fetch(s, self._q.waiters_in, params)
                    if found:
                        await self._runner.run(s, self._q.delete_waiters_in, params)
                taken += [_rows.waiter_from_row(row) for row in found]
            written = [delivered_signal(w, by_token[w.token], at) for w in taken]
            rows = [_rows.checkpoint_to_sql(cp) for cp in written]
            for chunk in _chunks(rows):
                await self._runner.many(s, self._q.save_cp, list(chunk))
            return written

        return await self._runner.transaction(work)

    async def save_checkpoints(self, cps: Sequence[StepCheckpoint]) -> None:
        if not cps:
            return
        rows = [_rows.checkpoint_to_sql(cp) for cp in cps]  # validate all before writing

        async def work(s: Session) -> None:
            for chunk in _chunks(rows):
                await self._runner.many(s, self._q.save_cp, list(chunk))

        await self._runner.transaction(work)

    async def fold_checkpoints(
        self, run_id: str, first_seq: int, last_seq: int, cp: StepCheckpoint
    ) -> None:
        row = _rows.checkpoint_to_sql(cp)
        params = {"run_id": run_id, "lo": first_seq, "hi": last_seq}

        async def work(s: Session) -> None:
            await self._runner.run(s, self._q.delete_cp_range, params)
            await self._runner.run(s, self._q.save_cp, row)

        await self._runner.transaction(work)

    async def claim_runs(
        self, ids: Sequence[str], owner: str, lease_until_ms: int, now_ms: int
    ) -> list[WorkflowRun]:
        if not ids:
            return []
        claimed: list[WorkflowRun] = []
        for chunk in _chunks(list(ids)):
            params = {
                "ids": self._dialect.list_value(chunk),
                "w_owner": owner,
                "w_until": int(lease_until_ms),
                "w_now": int(now_ms),
            }
            if self._q.claim_ids is not None:
                found = await self._runner.write_returning(self._q.claim_ids, params)
                claimed += [_rows.run_from_row(row) for row in found]
            else:
                claimed += await self._claim_ids_tx(params)
        return claimed

    async def _claim_ids_tx(self, params: dict[str, Any]) -> list[WorkflowRun]:
        async def work(s: Session) -> list[WorkflowRun]:
            return await self._claim_ids_without_returning(s, params)

        return await self._runner.transaction(work)

    async def _claim_ids_without_returning(
        self, s: Session, params: dict[str, Any]
    ) -> list[WorkflowRun]:
        found = [
            _rows.run_from_row(row)
            for row in await self._runner.fetch(s, self._q.claim_ids_pick, params)
        ]
        lock = {k: params[k] for k in ("w_owner", "w_until", "w_now")}
        if found:
            await self._runner.many(
                s, self._q.try_lock, [{**lock, "w_id": run.id} for run in found]
            )
        owner, until = params["w_owner"], params["w_until"]
        return [replace(run, locked_by=owner, locked_until=until) for run in found]
