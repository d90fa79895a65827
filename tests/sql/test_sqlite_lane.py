"""The SQLite loop lane (`durably._store.sql.sqlite_lane`): a statement alone in its loop
turn runs on the event loop's thread with no hand-off; requests of one turn still share a
group commit; a locked database, a slow statement and the WAL checkpoints all move back to
the writer thread. Real SQLite files; another connection plays the other process."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from durably._store.sql import SqlStateStore, sqlite_lane
from durably._store.sql import connection as connection_module
from durably._store.sql.sqlite_lane import LoopLane

from .conftest import Calls, make_cp, make_run


@pytest.fixture(autouse=True)
def no_stall_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """A loaded CI machine can pause any statement for 5 ms (the lane's stall limit), which
    would turn the lane off under these tests; the stall test sets its own limit."""
    monkeypatch.setattr(sqlite_lane, "STALL_S", 60.0)


def _lane(store: SqlStateStore) -> LoopLane:
    connector = store._cx
    assert isinstance(connector, connection_module.SqliteConnector)
    assert connector._lane is not None
    return connector._lane


def _seqs(db_path: Path) -> list[int]:
    with sqlite3.connect(db_path) as conn:
        rows = conn.execute("SELECT seq FROM durable_step_checkpoints ORDER BY seq").fetchall()
    return [seq for (seq,) in rows]


async def test_a_lone_statement_takes_the_lane_and_is_durable_when_acknowledged(
    store: SqlStateStore, db_path: Path, hops: Calls
) -> None:
    await store.create_run(make_run("base"))
    lane = _lane(store)
    hops.clear()
    before = lane.ran
    for seq in range(5):
        await store.save_checkpoint(make_cp("base", seq))
        assert _seqs(db_path)[-1] == seq  # another connection sees it the moment we return
    assert lane.ran == before + 5
    assert hops == []  # no statement went to the writer thread
    fetched = await store.get_checkpoint("base", 3)  # a point read: the lane too
    assert fetched is not None and fetched.seq == 3


async def test_requests_of_one_loop_turn_share_a_group_commit_instead(
    store: SqlStateStore, db_path: Path, hops: Calls
) -> None:
    await store.create_run(make_run("base"))
    lane = _lane(store)
    hops.clear()
    before = lane.ran
    await asyncio.gather(*(store.save_checkpoint(make_cp("base", seq)) for seq in range(40)))
    assert hops == [(40, True, True)]
    assert lane.ran == before
    assert _seqs(db_path) == list(range(40))


async def test_a_locked_database_goes_to_the_writer_thread_and_waits_there(
    store: SqlStateStore, db_path: Path, hops: Calls
) -> None:
    """Another process holds the write lock: the lane never waits for it on the loop (it
    gets SQLITE_BUSY at once, nothing written); the writer thread waits, then commits."""
    await store.create_run(make_run("base"))
    lane = _lane(store)
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    other.execute("UPDATE durable_workflow_runs SET updated_at = updated_at + 1 WHERE id = 'base'")
    hops.clear()
    loop = asyncio.get_running_loop()
    started = loop.time()
    write = asyncio.create_task(store.save_checkpoint(make_cp("base", 7)))
    await asyncio.sleep(0.2)
    assert loop.time() - started < 5  # the loop did not wait out the 10 s busy timeout
    assert not write.done() and lane.busy == 1
    other.execute("COMMIT")
    other.close()
    await asyncio.wait_for(write, 5)
    assert hops == [(1, False, False)]  # it went to the writer thread
    assert _seqs(db_path) == [7]


async def test_a_slow_lane_statement_turns_the_lane_off_for_a_while(
    store: SqlStateStore, db_path: Path, hops: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.create_run(make_run("base"))
    lane = _lane(store)
    monkeypatch.setattr(sqlite_lane, "STALL_S", 0.0)  # every lane statement counts as slow
    hops.clear()
    await store.save_checkpoint(make_cp("base", 0))  # on the lane, found slow
    assert lane.stalls == 1 and not lane.open and hops == []
    await store.save_checkpoint(make_cp("base", 1))  # the writer thread meanwhile
    assert hops == [(1, False, False)]
    monkeypatch.setattr(sqlite_lane, "BACKOFF_S", 0.0)
    lane._off_until = 0.0
    assert lane.open
    assert _seqs(db_path) == [0, 1]


async def test_lane_commits_are_checkpointed_on_the_writer_thread(
    store: SqlStateStore, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lane's connection never checkpoints (no fsync on the loop); every
    CHECKPOINT_EVERY lane commits one PASSIVE checkpoint runs on the writer thread."""
    monkeypatch.setattr(sqlite_lane, "CHECKPOINT_EVERY", 5)
    statements: list[str] = []
    real = connection_module.SqliteSession.sql

    async def spy(self: connection_module.SqliteSession, text: str) -> None:
        statements.append(text)
        await real(self, text)

    monkeypatch.setattr(connection_module.SqliteSession, "sql", spy)
    await store.create_run(make_run("base"))
    lane = _lane(store)
    lane._since_checkpoint = 0
    for seq in range(12):
        await store.save_checkpoint(make_cp("base", seq))
    await asyncio.sleep(0.05)  # the background checkpoints ran on the writer thread
    assert [t for t in statements if "wal_checkpoint" in t] == [
        "PRAGMA wal_checkpoint(PASSIVE)"
    ] * 2
    lane_conn = lane._conn
    assert lane_conn is not None
    assert lane_conn.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    assert lane_conn.execute("PRAGMA busy_timeout").fetchone() == (0,)
    assert _seqs(db_path) == list(range(12))


async def test_an_in_memory_database_has_no_lane() -> None:
    store = SqlStateStore.from_url("sqlite://")
    await store.ensure_schema()
    try:
        await store.create_run(make_run("m"))
        await store.save_checkpoint(make_cp("m", 0))
        connector = store._cx
        assert isinstance(connector, connection_module.SqliteConnector)
        assert connector._lane is None
        assert await store.get_checkpoint("m", 0) is not None
    finally:
        await store.close()


async def test_close_waits_for_a_scheduled_dispatch(db_path: Path) -> None:
    store = SqlStateStore.from_url(f"sqlite:///{db_path}")
    await store.ensure_schema()
    await store.create_run(make_run("base"))
    write = asyncio.create_task(store.save_checkpoint(make_cp("base", 0)))
    await asyncio.sleep(0)  # submitted; `_dispatch` is scheduled, not run yet
    await store.close()
    await write
    assert _seqs(db_path) == [0]


async def test_a_broken_lane_is_dropped_and_the_writer_thread_takes_over(
    store: SqlStateStore, db_path: Path, hops: Calls
) -> None:
    await store.create_run(make_run("base"))
    lane = _lane(store)
    lane_conn = lane._conn
    assert lane_conn is not None
    lane_conn.close()  # closed under the lane: its next use raises ProgrammingError
    hops.clear()
    await store.save_checkpoint(make_cp("base", 0))
    connector = store._cx
    assert isinstance(connector, connection_module.SqliteConnector)
    assert connector._lane is None
    assert hops == [(1, False, False)]
    assert _seqs(db_path) == [0]
