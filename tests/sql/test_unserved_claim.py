"""The pending claim past a parked backlog: 1,000 runs parked as unserved (`blocked`, code
`workflow.unserved`, older than every pending run) are outside the claim's range of the
pick-up index, so the claim — still one statement — walks the index, never sorts, and takes
the pending runs behind them (SQLite and PostgreSQL's generic plan)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from durably import StepError
from durably._store.sql.statements import Statements

from .conftest import at, make_run, open_store
from .test_pickup_index import NOW, _plan_postgres, _plan_sqlite, on_db

PARKED = 1_000


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
async def test_the_claim_walks_the_index_past_1000_parked_runs(kind: str, tmp_path: Path) -> None:
    async with open_store(kind, tmp_path / "u.db") as store:
        reason = StepError(message="no worker here serves workflow 'x'", code="workflow.unserved")
        for start in range(0, PARKED, 500):
            await store.create_runs(
                [
                    make_run(
                        f"p{i:05d}",
                        workflow="x",
                        status="blocked",
                        error=reason,
                        wake_at=NOW + 300_000,
                        created_at=at(i),
                    )
                    for i in range(start, start + 500)
                ]
            )
        await store.create_runs(
            [make_run(f"r{i}", status="pending", created_at=at(PARKED + i)) for i in range(3)]
        )
        await on_db(store, lambda conn: conn.exec_driver_sql("ANALYZE"))
        q = Statements(store.dialect)
        params = {"w_owner": "a", "w_until": NOW, "w_now": NOW, "lim": 16, "ns": "beta"}
        plan = _plan_sqlite if kind == "sqlite" else _plan_postgres
        for stmt in q.claim_pending:
            text = "\n".join(await on_db(store, lambda conn, stmt=stmt: plan(conn, stmt, params)))
            assert "durable_workflow_runs_pickup_idx" in text, text
            assert not re.search(r"TEMP B-TREE|\bSort\b", text), text
        claimed = await store.claim_pending_runs("a", NOW + 1, NOW, 16)
    assert [r.id for r in claimed] == ["r0", "r1", "r2"]
