"""Group commit on the SQLite writer: concurrent requests share one transaction, every
caller is acknowledged only after the COMMIT containing its write, and gets exactly its own
result or error (a failing request fails alone; a lost batch is re-run one by one)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from durably import SignalWaiter
from durably._store.sql import SqlStateStore
from durably._store.sql import connection as connection_module
from durably._store.sql.schema import runs
from tests.store.support import take_waiter, try_lock

from .conftest import Calls, make_cp, make_run, sqlite_url


def _rows(db_path: Path, sql: str) -> list[Any]:
    with sqlite3.connect(db_path) as conn:
        return conn.execute(sql).fetchall()


async def test_concurrent_writers_share_commits_and_survive_reopen(
    store: SqlStateStore, db_path: Path, hops: Calls
) -> None:
    n = 300

    async def life(i: int) -> None:
        await store.create_run(make_run(f"r{i}", status="pending"))
        await store.save_checkpoint(make_cp(f"r{i}", 0, status="pending"))
        assert await store.save_checkpoint_if_pending(make_cp(f"r{i}", 0))
        assert await store.update_run_if_status(f"r{i}", {"status": "completed"}, ["pending"])

    await asyncio.gather(*(life(i) for i in range(n)))
    # Batched: far fewer hops (and transactions) than requests, none above the cap.
    assert len(hops) < n
    assert max(size for size, _, _ in hops) > 1
    assert max(size for size, _, _ in hops) <= connection_module.SqliteConnector.max_batch
    await store.close()

    assert _rows(db_path, "SELECT count(*) FROM durable_workflow_runs WHERE status = 'completed'")
    assert _rows(db_path, "SELECT count(*) FROM durable_workflow_runs") == [(n,)]
    assert _rows(db_path, "SELECT count(*) FROM durable_step_checkpoints") == [(n,)]
    reopened = SqlStateStore.from_url(sqlite_url(db_path))
    try:
        found = await asyncio.gather(*(reopened.get_run(f"r{i}") for i in range(n)))
        assert all(run is not None and run.status == "completed" for run in found)
    finally:
        await reopened.close()


async def test_acknowledged_only_after_commit(store: SqlStateStore, db_path: Path) -> None:
    """The moment a caller's await returns, another connection sees its write."""
    await store.create_run(make_run())
    outsider = sqlite3.connect(db_path)
    seen: list[bool] = []

    async def write(seq: int) -> None:
        await store.save_checkpoint(make_cp(seq=seq))
        row = outsider.execute(
            "SELECT 1 FROM durable_step_checkpoints WHERE seq = ?", (seq,)
        ).fetchone()
        seen.append(row is not None)

    try:
        await asyncio.gather(*(write(seq) for seq in range(200)))
    finally:
        outsider.close()
    assert seen == [True] * 200


async def test_reads_on_the_writer_see_acknowledged_writes(store: SqlStateStore) -> None:
    async def write_then_read(i: int) -> None:
        await store.create_run(make_run(f"r{i}"))
        await store.update_run(f"r{i}", {"status": "completed"})
        run = await store.get_run(f"r{i}")
        assert run is not None and run.status == "completed"

    await asyncio.gather(*(write_then_read(i) for i in range(100)))


async def test_a_failing_statement_fails_alone(
    store: SqlStateStore, db_path: Path, hops: Calls
) -> None:
    await store.create_run(make_run("dup"))
    hops.clear()
    results = await asyncio.gather(
        *(store.create_run(make_run(f"r{i}")) for i in range(20)),
        store.create_run(make_run("dup")),
        *(store.create_run(make_run(f"s{i}")) for i in range(20)),
        return_exceptions=True,
    )
    assert hops == [(41, True, True)]  # one hop, one transaction: the duplicate was in it
    assert isinstance(results[20], sa.exc.IntegrityError)
    assert [r for i, r in enumerate(results) if i != 20] == [None] * 40
    assert _rows(db_path, "SELECT count(*) FROM durable_workflow_runs") == [(41,)]


async def test_conditional_row_counts_stay_exact_in_a_batch(store: SqlStateStore) -> None:
    await asyncio.gather(*(store.create_run(make_run(f"r{i}")) for i in range(10)))
    locks = await asyncio.gather(
        *(try_lock(store, f"r{i % 10}", f"owner-{i}", 5_000, 1_000) for i in range(100))
    )
    assert [i for i, won in enumerate(locks) if won] == list(range(10))  # first per run wins
    await asyncio.gather(
        *(store.put_signal_waiter(SignalWaiter(f"t{i}", "r0", i)) for i in range(5))
    )
    taken = await asyncio.gather(*(take_waiter(store, f"t{i % 5}") for i in range(25)))
    assert [i for i, w in enumerate(taken) if w is not None] == list(range(5))


async def test_a_failing_transaction_rolls_back_alone(
    store: SqlStateStore, db_path: Path, monkeypatch: pytest.MonkeyPatch, hops: Calls
) -> None:
    await store.create_run(make_run())
    for seq in range(4):
        await store.save_checkpoint(make_cp(seq=seq, status="pending"))
    real_many = store._runner.many

    async def failing_many(session: Any, stmt: Any, params: Any) -> None:
        await real_many(session, stmt, params)  # the UPDATE writes, then the call blows up
        if any(p["w_seq"] == 0 for p in params):
            raise RuntimeError("injected")

    monkeypatch.setattr(store._runner, "many", failing_many)
    hops.clear()
    results = await asyncio.gather(
        store.save_checkpoints_if_pending([make_cp(seq=0), make_cp(seq=1)]),
        store.save_checkpoints_if_pending([make_cp(seq=2), make_cp(seq=3)]),
        store.save_checkpoint(make_cp(seq=9)),
        return_exceptions=True,
    )
    assert isinstance(results[0], RuntimeError)
    assert results[1:] == [[True, True], None]
    assert hops == [(1, False, True)]  # one transaction, committed with the last statement
    statuses = _rows(db_path, "SELECT seq, status FROM durable_step_checkpoints ORDER BY seq")
    assert statuses == [
        (0, "pending"),
        (1, "pending"),  # all or nothing for the failed call
        (2, "completed"),
        (3, "completed"),
        (9, "completed"),
    ]


async def test_slow_path_statements_and_work_join_a_batch(store: SqlStateStore) -> None:
    """Statements without the fast path and `work` callbacks run inside the batch too."""
    cx: Any = store._cx
    await store.create_run(make_run())
    unregistered = sa.update(runs).where(runs.c.id == sa.bindparam("w_id"))

    async def read_status(s: Any) -> Any:
        return (await s.fetch(sa.select(runs.c.status).where(runs.c.id == "r1")))[0][0]

    results = await asyncio.gather(
        cx.execute(unregistered, {"w_id": "r1", "status": "suspended"}),
        store.save_checkpoint(make_cp()),
        cx.write(read_status),
        cx.execute(unregistered, {"w_id": "nope", "status": "suspended"}),
        store.get_checkpoint("r1", 0),
    )
    assert results[0] == 1 and results[2] == "suspended" and results[3] == 0
    assert results[4] is not None


async def _tagged_life(store: SqlStateStore, i: int) -> None:
    # a multi-statement transaction: the run row and its tag rows
    await store.create_run(make_run(f"r{i}", tags=("a", "b")))


async def test_cancelled_callers_commit_fully_or_not_at_all(
    store: SqlStateStore, db_path: Path
) -> None:
    await store.create_run(make_run("base"))
    tasks = [asyncio.create_task(_tagged_life(store, i)) for i in range(60)]
    tasks += [asyncio.create_task(store.save_checkpoint(make_cp("base", i))) for i in range(60)]
    await asyncio.sleep(0)  # queued: the first batch is on its way
    for task in tasks[::3]:
        task.cancel()
    await asyncio.sleep(0)
    for task in tasks[1::3]:
        task.cancel()  # some of these are mid-batch
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(o is None or isinstance(o, asyncio.CancelledError) for o in outcomes)
    assert all(o is None for o in outcomes[2::3])  # never cancelled: acknowledged
    # The store stays healthy and every transaction is all or nothing.
    await store.save_checkpoint(make_cp("base", 999))
    assert await store.get_checkpoint("base", 999) is not None
    run_ids = {r[0] for r in _rows(db_path, "SELECT id FROM durable_workflow_runs")}
    tag_rows = _rows(db_path, "SELECT run_id, count(*) FROM durable_run_tags GROUP BY run_id")
    assert {run_id for run_id, _ in tag_rows} == run_ids - {"base"}
    assert all(count == 2 for _, count in tag_rows)


async def test_a_lost_batch_is_rerun_one_by_one(
    store: SqlStateStore, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction lost as a whole (here: a failed COMMIT) acknowledges nothing; each
    request then runs alone and gets exactly its own result; statements count once."""
    await store.create_run(make_run("dup"))
    real = connection_module._run_ops
    lost: list[int] = []

    def losing(conn: sqlite3.Connection, ops: Any, begin: bool, commit: bool, in_tx: bool) -> Any:
        if commit and not lost:
            lost.append(len(ops))
            real(conn, ops, begin, False, in_tx)
            conn.execute("ROLLBACK")
            return None
        return real(conn, ops, begin, commit, in_tx)

    def workload() -> list[Any]:
        return [
            *(store.create_run(make_run(f"r{i}", tags=("t",))) for i in range(5)),  # tx work
            store.create_run(make_run("dup")),
            *(store.save_checkpoint(make_cp(f"r{i}", 0)) for i in range(5)),
            try_lock(store, "dup", "me", 10, 0),
        ]

    before = store.statement_count
    monkeypatch.setattr(connection_module, "_run_ops", losing)
    results = await asyncio.gather(*workload(), return_exceptions=True)
    counted = store.statement_count - before
    assert lost  # the group commit was lost once, then everything re-ran alone
    assert results[:5] == [None] * 5
    assert isinstance(results[5], sa.exc.IntegrityError)
    assert results[6:] == [None] * 5 + [True]
    assert _rows(db_path, "SELECT count(*) FROM durable_run_tags") == [(5,)]
    assert _rows(db_path, "SELECT count(*) FROM durable_step_checkpoints") == [(5,)]

    # The same workload without a failure counts the same statements.
    monkeypatch.undo()
    await store.delete_run("dup")
    for i in range(5):
        await store.delete_run(f"r{i}")
    await store.create_run(make_run("dup"))
    before = store.statement_count
    await asyncio.gather(*workload(), return_exceptions=True)
    assert store.statement_count - before == counted


async def test_close_drains_queued_writes(db_path: Path) -> None:
    store = SqlStateStore.from_url(sqlite_url(db_path))
    await store.ensure_schema()
    tasks = [asyncio.create_task(store.create_run(make_run(f"r{i}"))) for i in range(50)]
    await asyncio.sleep(0)
    await store.close()
    await asyncio.gather(*tasks)
    assert _rows(db_path, "SELECT count(*) FROM durable_workflow_runs") == [(50,)]
