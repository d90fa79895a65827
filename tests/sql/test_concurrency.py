"""Many coroutines in one process, several processes on one file, cancellation, crashes."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import textwrap
from pathlib import Path

from durably import RunQuery
from durably._core.models import replace
from durably._store.sql import SqlStateStore
from tests.store.support import take_buffered, take_waiter, try_lock

from .conftest import at, make_cp, make_run, sqlite_url

SRC = str(Path(__file__).resolve().parents[2] / "src")


async def _life(store: SqlStateStore, i: int) -> None:
    run_id = f"run-{i:03d}"
    await store.create_run(
        make_run(run_id, status="pending", tags=(f"t{i % 7}",), search_attributes={"i": i})
    )
    await store.save_checkpoint(make_cp(run_id, 0, status="pending"))
    await store.save_checkpoint_if_pending(make_cp(run_id, 0, output={"i": i}))
    await store.update_run(run_id, {"status": "completed", "output": {"i": i}})
    run = await store.get_run(run_id)
    assert run is not None and run.status == "completed"


async def test_300_concurrent_coroutines_on_one_file(store: SqlStateStore, db_path: Path) -> None:
    await asyncio.gather(*(_life(store, i) for i in range(300)))
    assert await store.count_runs(RunQuery(status="completed")) == 300
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM durable_workflow_runs").fetchone() == (300,)
        assert conn.execute(
            "SELECT count(*) FROM durable_step_checkpoints WHERE status = 'completed'"
        ).fetchone() == (300,)
        assert conn.execute("SELECT count(*) FROM durable_run_tags").fetchone() == (300,)
        assert conn.execute("SELECT count(*) FROM durable_run_attributes").fetchone() == (300,)
    assert len(await store.list_runs(RunQuery(tag="t3"))) == len(range(3, 300, 7))


async def test_concurrent_leases_have_one_winner(store: SqlStateStore) -> None:
    await store.create_run(make_run())
    results = await asyncio.gather(
        *(try_lock(store, "r1", f"owner-{i}", 5_000, 1_000) for i in range(50))
    )
    assert results.count(True) == 1
    claims = await asyncio.gather(
        *(store.claim_run("r1", f"late-{i}", 9_000, 6_000) for i in range(50))
    )
    assert sum(c is not None for c in claims) == 1


async def test_take_once_under_concurrency(store: SqlStateStore) -> None:
    from durably import SignalWaiter

    await store.put_signal_waiter(SignalWaiter("tok", "r1", 0))
    for n in range(20):
        await store.buffer_signal("buf", n)
    waiters = await asyncio.gather(*(take_waiter(store, "tok") for _ in range(30)))
    assert sum(w is not None for w in waiters) == 1
    taken = await asyncio.gather(*(take_buffered(store, "buf") for _ in range(30)))
    payloads = sorted(t.payload for t in taken if t is not None)
    assert payloads == list(range(20))


async def test_in_memory_url_shares_one_database_under_concurrency() -> None:
    store = SqlStateStore.from_url("sqlite://")
    await store.ensure_schema()
    try:
        await asyncio.gather(*(_life(store, i) for i in range(100)))
        assert await store.count_runs(RunQuery()) == 100
    finally:
        await store.close()


async def test_cancelled_writers_leave_the_store_usable(store: SqlStateStore) -> None:
    await store.create_run(make_run())
    tasks = [
        asyncio.create_task(store.save_checkpoints_if_pending([make_cp(seq=i), make_cp(seq=i)]))
        for i in range(50)
    ]
    await asyncio.sleep(0)
    for task in tasks[::2]:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # Shielded writes either completed fully or not at all; the writer connection is healthy.
    await store.save_checkpoint(make_cp(seq=999))
    assert (await store.get_checkpoint("r1", 999)) is not None
    await store.update_run("r1", {"tags": ("a",), "search_attributes": {"k": 1}})
    run = await store.get_run("r1")
    assert run is not None and run.tags == ("a",)


_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, {src!r})
    from datetime import datetime, timezone
    from durably._core.models import StepCheckpoint, WorkflowRun
    from durably._store.sql import SqlStateStore

    async def main(prefix: str, n: int, crash: bool) -> None:
        store = SqlStateStore.from_url({url!r})
        await store.ensure_schema()
        now = datetime.now(timezone.utc)

        async def one(i: int) -> None:
            rid = f"{{prefix}}-{{i}}"
            await store.create_run(WorkflowRun(
                id=rid, workflow="w", workflow_version="1", status="running",
                created_at=now, updated_at=now, tags=("x",)))
            await store.save_checkpoint(StepCheckpoint(
                run_id=rid, seq=0, name="s", kind="local", step_id=rid + ":0",
                status="completed", started_at=now, finished_at=now))
            await store.update_run(rid, {{"status": "completed"}})

        await asyncio.gather(*(one(i) for i in range(n)))
        if crash:
            import os
            os._exit(0)  # no close, no checkpoint of the WAL: a crashed engine
        await store.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "crash"))
    """
)


async def _spawn(script: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_two_processes_write_one_file(store: SqlStateStore, db_path: Path) -> None:
    script = _WRITER.format(src=SRC, url=sqlite_url(db_path))
    child = await _spawn(script, "child", "200", "clean")
    # this process writes (and reads) at the same time
    await asyncio.gather(*(_life(store, i) for i in range(200)))
    _, err = await child.communicate()
    assert child.returncode == 0, err.decode()
    assert await store.count_runs(RunQuery(status="completed")) == 400
    assert await store.count_runs(RunQuery(tag="x")) == 200


async def test_recover_after_a_crashed_process(tmp_path: Path) -> None:
    path = tmp_path / "crash.db"
    script = _WRITER.format(src=SRC, url=sqlite_url(path))
    child = await _spawn(script, "dead", "50", "crash")
    _, err = await child.communicate()
    assert child.returncode == 0, err.decode()
    recovering = SqlStateStore.from_url(sqlite_url(path))
    await recovering.ensure_schema()
    try:
        assert await recovering.count_runs(RunQuery(status="completed")) == 50
        # and it can write on top of the crashed process's WAL
        await recovering.update_run("dead-0", {"status": "running", "wake_at": 5})
        run = await recovering.get_run("dead-0")
        assert run is not None and run.status == "running" and run.wake_at == 5
    finally:
        await recovering.close()


async def test_a_reader_process_sees_committed_writes(store: SqlStateStore, db_path: Path) -> None:
    await store.create_run(make_run())
    await store.save_checkpoint(replace(make_cp(), finished_at=at(3)))
    reader = SqlStateStore.from_url(sqlite_url(db_path))
    try:
        cps = await reader.list_checkpoints("r1")
        assert [cp.finished_at for cp in cps] == [at(3)]
        await store.update_run("r1", {"status": "completed"})
        run = await reader.get_run("r1")
        assert run is not None and run.status == "completed"
    finally:
        await reader.close()
