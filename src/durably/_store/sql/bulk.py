"""Multi-row operations of the SQL store, used by fans.

A fan of N members must cost O(N / batch) round trips, not O(N): these methods take a list
and write it with one `executemany` (or look it up with one `IN` list) per chunk, inside
one transaction where the contract asks for atomicity. The in-memory reference store
implements the same contracts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from durably._store.sql.connection import Connector, Session
    from durably._store.sql.dialect import SqlDialect
    from durably._store.sql.statements import Statements


def _chunks(items: Sequence[Any], size: int = BULK_CHUNK) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class BulkOps:
    """Mixed into `SqlStateStore` (which provides what is declared here)."""

    dialect: SqlDialect
    statement_count: int
    _q: Statements
    _cx: Connector

    if TYPE_CHECKING:

        async def _fetch(self, s: Session, stmt: Any, params: Any = None) -> Sequence[Any]: ...
        async def _run(self, s: Session, stmt: Any, params: Any = None) -> int: ...
        async def _many(self, s: Session, stmt: Any, params: list[dict[str, Any]]) -> None: ...

    async def register_child_waits(self, waits: Sequence[ChildWait]) -> None:
        """In ONE transaction, upsert every waiter and
        insert each placeholder whose `(run_id, seq)` has no row yet (an existing row, e.g. a
        completion already delivered, is never overwritten)."""
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
                await self._many(s, self._q.put_waiter, list(chunk))
            for chunk in _chunks(placeholders):
                await self._many(s, self._q.insert_cp_ignore, list(chunk))

        await self._cx.write(work, tx=True)

    async def create_runs(self, new_runs: Sequence[WorkflowRun]) -> list[str | None]:
        """Insert every run whose id is free, in ONE transaction; for each entry,
        `None` when this call created it, else the workflow name of the run already holding
        the id (the caller decides between idempotent and conflicting)."""
        if not new_runs:
            return []
        ids = [run.id for run in new_runs]

        async def work(s: Session) -> list[str | None]:
            existing: dict[str, str] = {}
            for chunk in _chunks(ids):
                params = {"ids": self.dialect.list_value(chunk)}
                for row in await self._fetch(s, self._q.existing_runs, params):
                    existing[str(row[0])] = str(row[1])
            fresh = [run for run in new_runs if run.id not in existing]
            tag_rows = [row for run in fresh for row in _rows.tag_rows(run.id, run.tags)]
            attr_rows = [
                row for run in fresh for row in _rows.attribute_rows(run.id, run.search_attributes)
            ]
            for chunk in _chunks([_rows.run_to_sql(run) for run in fresh]):
                await self._many(s, self._q.insert_run_ignore, list(chunk))
            for chunk in _chunks(tag_rows):
                await self._many(s, self._q.insert_tags_ignore, list(chunk))
            for chunk in _chunks(attr_rows):
                await self._many(s, self._q.insert_attrs, list(chunk))
            return [existing.get(run_id) for run_id in ids]

        return await self._cx.write(work, tx=True)

    async def deliver_signals(
        self, payloads: Sequence[tuple[str, JSONValue]], at: datetime
    ) -> list[StepCheckpoint]:
        """Signal delivery for many tokens in ONE transaction: take every
        existing waiter (`DELETE … WHERE token IN … RETURNING`) and upsert its `signal:<token>`
        checkpoint; a crash can't take a waiter without writing its row. Returns the rows
        written (tokens without a waiter are left to the caller)."""
        if not payloads:
            return []
        by_token = dict(payloads)  # a later payload for the same token wins
        tokens = list(by_token)

        async def work(s: Session) -> list[StepCheckpoint]:
            taken: list[SignalWaiter] = []
            for chunk in _chunks(tokens):
                params = {"tokens": self.dialect.list_value(chunk)}
                if self._q.take_waiters_in is not None:
                    found = await self._fetch(s, self._q.take_waiters_in, params)
                else:
                    found = await self._fetch(s, self._q.waiters_in, params)
                    if found:
                        await self._run(s, self._q.delete_waiters_in, params)
                taken += [_rows.waiter_from_row(row) for row in found]
            written = [delivered_signal(w, by_token[w.token], at) for w in taken]
            rows = [_rows.checkpoint_to_sql(cp) for cp in written]
            for chunk in _chunks(rows):
                await self._many(s, self._q.save_cp, list(chunk))
            return written

        return await self._cx.write(work, tx=True)

    async def fold_checkpoints(
        self, run_id: str, first_seq: int, last_seq: int, cp: StepCheckpoint
    ) -> None:
        """Replace the rows of `first_seq..last_seq` by ONE folded
        `fan:` row (`cp`, at `first_seq`), in one transaction."""
        row = _rows.checkpoint_to_sql(cp)
        params = {"run_id": run_id, "lo": first_seq, "hi": last_seq}

        async def work(s: Session) -> None:
            await self._run(s, self._q.delete_cp_range, params)
            await self._run(s, self._q.save_cp, row)

        await self._cx.write(work, tx=True)

    async def claim_runs(
        self, ids: Sequence[str], owner: str, lease_until_ms: int, now_ms: int
    ) -> list[WorkflowRun]:
        """`claim_pending_runs` for known ids (the children this engine just
        created): lease those still `pending` with a free or expired lease, by primary key
        (no scan of the pending backlog, whose plan degrades while a wide fan churns it)."""
        if not ids:
            return []
        claimed: list[WorkflowRun] = []
        for chunk in _chunks(list(ids)):
            params = {
                "ids": self.dialect.list_value(chunk),
                "w_owner": owner,
                "w_until": int(lease_until_ms),
                "w_now": int(now_ms),
            }
            if self._q.claim_ids is not None:
                self.statement_count += 1
                found = await self._cx.fetch(self._q.claim_ids, params, write=True)
                claimed += [_rows.run_from_row(row) for row in found]
            else:
                claimed += await self._claim_ids_tx(params)
        return claimed

    async def _claim_ids_tx(self, params: dict[str, Any]) -> list[WorkflowRun]:
        async def work(s: Session) -> list[WorkflowRun]:
            return await self._claim_ids_without_returning(s, params)

        result: list[WorkflowRun] = await self._cx.write(work, tx=True)
        return result

    async def _claim_ids_without_returning(
        self, s: Session, params: dict[str, Any]
    ) -> list[WorkflowRun]:
        found = [
            _rows.run_from_row(row) for row in await self._fetch(s, self._q.claim_ids_pick, params)
        ]
        lock = {k: params[k] for k in ("w_owner", "w_until", "w_now")}
        if found:
            await self._many(s, self._q.try_lock, [{**lock, "w_id": run.id} for run in found])
        owner, until = params["w_owner"], params["w_until"]
        return [replace(run, locked_by=owner, locked_until=until) for run in found]
