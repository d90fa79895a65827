"""SqlStateStore specifics: statement counts, URLs, RETURNING fallback, atomicity, prefixes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.pool import StaticPool

from durably import AttributeFilter, RunQuery, SignalWaiter, StateStore
from durably._core.models import BufferedEvent
from durably._store.protocol import missing_store_methods
from durably._store.sql import SqlStateStore
from durably._store.sql import connection as connection_module
from durably._store.sql.dialect import SqlDialect, create_engine, normalize_url
from durably._store.sql.statements import Statements
from tests.store.support import take_buffered, take_waiter, try_lock

from .conftest import BOTH, SQLITE_ONLY, at, make_cp, make_run, open_store, raw, sqlite_url


@pytest.fixture(params=BOTH)
async def store(request: pytest.FixtureRequest, db_path: Path) -> AsyncIterator[SqlStateStore]:
    """This module runs on SQLite and PostgreSQL (SQLite-only tests say `SQLITE_ONLY`)."""
    async with open_store(request.param, db_path) as sql:
        yield sql


# ------------------------------------------------------------------ statement counts


async def count(store: SqlStateStore, coro: Any) -> int:
    before = store.statement_count
    await coro
    return store.statement_count - before


async def test_statement_count_one_per_plain_call(store: SqlStateStore) -> None:
    assert await count(store, store.create_run(make_run())) == 1
    assert await count(store, store.save_checkpoint(make_cp(status="pending"))) == 1
    assert await count(store, store.get_run("r1")) == 1
    assert await count(store, store.get_checkpoint("r1", 0)) == 1
    assert await count(store, store.update_run("r1", {"status": "suspended"})) == 1
    assert await count(store, store.update_run("r1", {})) == 0
    assert await count(store, store.update_run("r1", {"updated_at": None})) == 0
    assert await count(store, store.list_checkpoints("r1")) == 1
    assert await count(store, store.save_checkpoint_if_pending(make_cp())) == 1
    assert await count(store, store.save_checkpoints_if_pending([])) == 0
    assert await count(store, store.save_checkpoints_if_pending([make_cp()])) == 1
    many = [make_cp(seq=i) for i in range(50)]
    assert await count(store, store.save_checkpoints_if_pending(many)) == 1  # nothing pending
    assert await count(store, try_lock(store, "r1", "a", 10, 0)) == 1
    assert await count(store, store.claim_run("r1", "a", 10, 20)) == 1
    assert await count(store, store.renew_run_locks("a", 40)) == 1
    assert await count(store, store.release_locks_of("a")) == 1
    assert await count(store, store.release_run_lock("r1")) == 1
    assert await count(store, store.put_signal_waiter(SignalWaiter("t", "r1", 0))) == 1
    assert await count(store, store.remove_signal_waiter(SignalWaiter("t", "r1", 0))) == 1
    assert await count(store, store.list_signal_waiters("x")) == 1
    assert await count(store, store.buffer_signal("t", 1)) == 1
    assert await count(store, store.peek_buffered_signals("t", 5)) == 1
    assert await count(store, store.list_runs(RunQuery(tag="x", statuses=["running"]))) == 1
    assert await count(store, store.count_runs(RunQuery())) == 1
    assert await count(store, store.list_checkpoints_by_name_prefix("r1", [])) == 0
    assert await count(store, store.count_checkpoints("r1", 0, 9, [])) == 0
    assert await count(store, store.get_latest_checkpoint_by_name("r1", "reserve")) == 1
    await store.create_run(make_run("p", status="pending"))
    assert await count(store, store.claim_pending_runs("o", 10, 0, 5)) == 1
    assert await count(store, store.claim_pending_runs("o", 10, 0, 5, "acme")) == 1
    assert await count(store, store.claim_pending_runs("o", 10, 0, 0)) == 0


async def test_statement_count_of_multi_statement_methods(store: SqlStateStore) -> None:
    # tags + attributes ride the same transaction: INSERT run + INSERT tags + INSERT attrs
    run = make_run(tags=("a", "b"), search_attributes={"k": 1, "s": "x"})
    assert await count(store, store.create_run(run)) == 3
    # UPDATE + DELETE/INSERT attrs + DELETE/INSERT tags
    patch: Any = {"tags": ("c",), "search_attributes": {"k": 2}}
    assert await count(store, store.update_run("r1", patch)) == 5
    # batched CAS over pending rows: SELECT pending keys + one executemany UPDATE
    for i in range(10):
        await store.save_checkpoint(make_cp(seq=i, status="pending"))
    batch = [make_cp(seq=i) for i in range(10)]
    assert await count(store, store.save_checkpoints_if_pending(batch)) == 2
    assert await count(store, store.delete_run("r1")) == 6  # + its start dedup row


@SQLITE_ONLY
async def test_hot_paths_take_one_driver_call(
    store: SqlStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prebuilt statements bypass SQLAlchemy's 4-call cursor dance (one aiosqlite call)."""
    import aiosqlite.core

    calls: list[str] = []
    real: Any = aiosqlite.core.Connection._execute

    async def spy(self: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(fn, "__name__", "?"))
        return await real(self, fn, *args, **kwargs)

    await store.list_incomplete_runs()  # opens a pooled reader
    await store.get_run("warm-up")  # opens the writer
    connector = store._cx
    assert isinstance(connector, connection_module.SqliteConnector)
    connector._close_lane()  # the writer thread's path (the loop lane: test_sqlite_lane.py)
    monkeypatch.setattr(aiosqlite.core.Connection, "_execute", spy)
    cases: list[tuple[str, Any]] = [
        ("create_run", store.create_run(make_run())),
        ("save_checkpoint", store.save_checkpoint(make_cp(status="pending"))),
        ("get_run", store.get_run("r1")),
        ("get_checkpoint", store.get_checkpoint("r1", 0)),
        ("update_run", store.update_run("r1", {"status": "suspended", "wake_at": 5})),
        ("save_checkpoint_if_pending", store.save_checkpoint_if_pending(make_cp())),
        ("claim_run", store.claim_run("r1", "A", 10, 0)),
        ("list_checkpoints", store.list_checkpoints("r1")),
        ("list_due_timers", store.list_due_timers(10, "default", 5)),
        ("count_checkpoints", store.count_checkpoints("r1", 0, 9, ["pending", "failed"])),
        ("peek_buffered_signals", store.peek_buffered_signals("t", 5)),
    ]
    for name, coro in cases:
        calls.clear()
        await coro
        assert len(calls) == 1, (name, calls)


# ------------------------------------------------------------------ protocol shape


async def test_implements_the_protocols(store: SqlStateStore) -> None:
    assert isinstance(store, StateStore)
    assert missing_store_methods(store) == []


# ------------------------------------------------------------------ URLs and engines


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///relative.db", "sqlite+aiosqlite:///relative.db"),
        ("sqlite:////abs/path.db", "sqlite+aiosqlite:////abs/path.db"),
        ("sqlite://", "sqlite+aiosqlite://"),
        ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite:///x.db"),
        ("postgresql://u:p@h:5432/db", "postgresql+asyncpg://u:p@h:5432/db"),
        ("postgres://u@h/db", "postgresql+asyncpg://u@h/db"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg://u@h/db"),
    ],
)
def test_normalize_url(url: str, expected: str) -> None:
    assert normalize_url(url).render_as_string(hide_password=False) == expected


def test_unsupported_database() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        create_engine("mysql://u@h/db")


async def test_memory_url_uses_a_static_pool() -> None:
    store = SqlStateStore.from_url("sqlite://")
    assert isinstance(store.engine.sync_engine.pool, StaticPool)
    await store.close()


@SQLITE_ONLY
async def test_file_connections_get_the_pragmas(store: SqlStateStore) -> None:
    from sqlalchemy import text

    async with store.engine.connect() as conn:
        values = [
            (await conn.execute(text(f"PRAGMA {name}"))).scalar()
            for name in ("journal_mode", "synchronous", "busy_timeout", "foreign_keys")
        ]
    assert values == ["wal", 1, 10_000, 0]


async def test_close_disposes_only_an_owned_engine(db_path: Path) -> None:
    engine = create_engine(sqlite_url(db_path))
    store = SqlStateStore(engine)
    await store.ensure_schema()
    await store.create_run(make_run())
    await store.close()
    async with engine.connect() as conn:  # still usable: the caller owns it
        from sqlalchemy import text

        assert (await conn.execute(text("SELECT count(*) FROM durable_workflow_runs"))).scalar()
    await engine.dispose()
    async with SqlStateStore.from_url(sqlite_url(db_path)) as owned:
        assert await owned.get_run("r1") is not None


async def test_clock_stamps_updated_at(db_path: Path) -> None:
    store = SqlStateStore.from_url(sqlite_url(db_path), clock=lambda: at(60, ms=7))
    await store.ensure_schema()
    await store.create_run(make_run())
    await store.update_run("r1", {"status": "completed"})
    run = await store.get_run("r1")
    assert run is not None and run.updated_at == at(60, ms=7)
    await store.update_run("r1", {"status": "failed", "updated_at": at(2)})
    run = await store.get_run("r1")
    assert run is not None and run.updated_at == at(2)
    with pytest.raises(ValueError, match="unknown RunPatch key"):
        await store.update_run("r1", {"lockedBy": "x"})  # type: ignore[typeddict-unknown-key]
    await store.close()


# ------------------------------------------------------------------ RETURNING fallback


@pytest.fixture
async def no_returning(db_path: Path) -> AsyncIterator[SqlStateStore]:
    """The same store as on SQLite < 3.35 (no UPDATE/DELETE … RETURNING)."""
    store = SqlStateStore.from_url(sqlite_url(db_path))
    store._assemble(SqlDialect("sqlite", returning=False))  # statements and parts alike
    await store.ensure_schema()
    yield store
    await store.close()


async def test_returning_fallback(no_returning: SqlStateStore) -> None:
    store = no_returning
    await store.create_run(make_run())
    claimed = await store.claim_run("r1", "A", 2000, 1000)
    assert claimed is not None and claimed.locked_by == "A" and claimed.locked_until == 2000
    assert await store.claim_run("r1", "B", 3000, 1500) is None
    await store.put_signal_waiter(SignalWaiter("tok", "r1", 3, "g"))
    assert await take_waiter(store, "tok") == SignalWaiter("tok", "r1", 3, "g")
    assert await take_waiter(store, "tok") is None
    await store.buffer_signal("s", {"n": 1})
    await store.buffer_signal("s", None)
    first = await take_buffered(store, "s")
    second = await take_buffered(store, "s")
    assert first is not None and first.payload == {"n": 1}
    assert second is not None and second.payload is None
    assert await take_buffered(store, "s") is None
    for i in range(3):
        await store.create_run(make_run(f"p{i}", status="pending", created_at=at(i)))
    before = store.statement_count
    claimed = await store.claim_pending_runs("C", 9000, 1000, 2)
    assert store.statement_count - before == 2  # SELECT candidates + executemany lease
    assert [(r.id, r.locked_by, r.locked_until) for r in claimed] == [
        ("p0", "C", 9000),
        ("p1", "C", 9000),
    ]
    p1 = await store.get_run("p1")
    assert p1 is not None and p1.locked_by == "C" and p1.locked_until == 9000
    assert [r.id for r in await store.claim_pending_runs("D", 9000, 1000, 5)] == ["p2"]


# ------------------------------------------------------------------ batched CAS atomicity


async def test_batched_cas_rolls_back_on_a_database_error(
    store: SqlStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for seq in range(3):
        await store.save_checkpoint(make_cp(seq=seq, status="pending"))
    real_many = store._runner.many

    async def failing_many(session: Any, stmt: Any, params: Any) -> None:
        await real_many(session, stmt, params)  # the executemany UPDATE writes, then blows up
        raise RuntimeError("injected")

    monkeypatch.setattr(store._runner, "many", failing_many)
    with pytest.raises(RuntimeError, match="injected"):
        await store.save_checkpoints_if_pending([make_cp(seq=s) for s in range(3)])
    monkeypatch.undo()
    statuses = await raw(store, "SELECT status FROM durable_step_checkpoints")
    assert statuses == [("pending",)] * 3
    assert await store.save_checkpoints_if_pending([make_cp(seq=s) for s in range(3)]) == [True] * 3


async def test_batched_cas_sequential_semantics(store: SqlStateStore) -> None:
    await store.save_checkpoint(make_cp(seq=5, status="pending"))
    await store.save_checkpoint(make_cp(seq=6, status="completed"))
    await store.save_checkpoint(make_cp(seq=7, status="pending"))
    batch = [
        make_cp(seq=5, status="pending", output={"step": 1}),  # still pending after write
        make_cp(seq=6, output={"late": True}),  # settled row: refused
        make_cp(seq=5, status="completed", output={"step": 2}),  # sees step 1: pending → wins
        make_cp(seq=5, status="failed"),  # sees step 2: completed → refused
        make_cp(seq=8),  # absent row: refused
        make_cp(seq=7, status="failed", output=None),
    ]
    assert await store.save_checkpoints_if_pending(batch) == [True, False, True, False, False, True]
    cp5 = await store.get_checkpoint("r1", 5)
    cp6 = await store.get_checkpoint("r1", 6)
    cp7 = await store.get_checkpoint("r1", 7)
    assert cp5 is not None and cp5.status == "completed" and cp5.output == {"step": 2}
    assert cp6 is not None and cp6.output == {"ok": True}
    assert cp7 is not None and cp7.status == "failed" and cp7.output is None
    assert await store.get_checkpoint("r1", 8) is None


async def test_batched_cas_over_many_keys(store: SqlStateStore) -> None:
    for seq in range(1000):
        await store.save_checkpoint(make_cp(seq=seq, status="pending" if seq % 2 else "running"))
    results = await store.save_checkpoints_if_pending([make_cp(seq=s) for s in range(1000)])
    assert results == [bool(s % 2) for s in range(1000)]
    assert await store.count_checkpoints("r1", 0, 999, ["completed"]) == 500


# ------------------------------------------------------------------ prefix matching (never LIKE)


async def test_waiter_prefixes_are_exact_and_case_sensitive(store: SqlStateStore) -> None:
    tokens = [
        "wh:r_1:0",
        "wh:rx1:0",
        "WH:r_1:1",
        "wh:r%1:2",
        "wh:r",
        "w",
        "ü:x",
        "üa",
        "\U0010ffffz",
    ]
    for i, token in enumerate(tokens):
        await store.put_signal_waiter(SignalWaiter(token, f"run{i}", i))

    async def listed(prefix: str) -> list[str]:
        return [w.token for w in await store.list_signal_waiters(prefix)]

    assert await listed("wh:r_") == ["wh:r_1:0"]
    assert await listed("wh:r%") == ["wh:r%1:2"]
    assert await listed("WH:") == ["WH:r_1:1"]
    assert await listed("wh:r") == ["wh:r_1:0", "wh:rx1:0", "wh:r%1:2", "wh:r"]
    assert await listed("ü") == ["ü:x", "üa"]
    assert await listed("\U0010ffff") == ["\U0010ffffz"]
    assert await listed("nope") == []
    assert len(await listed("")) == len(tokens)


async def test_checkpoint_name_prefixes(store: SqlStateStore) -> None:
    names = [
        "reserve",
        "spawn:0",
        "signal:child:c2",
        "event:progress",
        "spawn:1",
        "Spawn:2",
        "fan_x",
    ]
    for seq, name in enumerate(names):
        await store.save_checkpoint(make_cp(seq=seq, name=name))
    found = await store.list_checkpoints_by_name_prefix("r1", ["signal:child:", "spawn:"])
    assert [cp.name for cp in found] == ["spawn:0", "signal:child:c2", "spawn:1"]
    assert [cp.name for cp in await store.list_checkpoints_by_name_prefix("r1", ["fan_"])] == [
        "fan_x"
    ]
    assert await store.list_checkpoints_by_name_prefix("r1", ["fan%"]) == []


async def test_tags_with_special_characters(store: SqlStateStore) -> None:
    await store.create_run(make_run("a", tags=('q"uote', "50%", "under_score")))
    await store.create_run(make_run("b", tags=("50", "underXscore"), created_at=at(1)))
    assert [r.id for r in await store.list_runs(RunQuery(tag="50%"))] == ["a"]
    assert [r.id for r in await store.list_runs(RunQuery(tag='q"uote'))] == ["a"]
    assert [r.id for r in await store.list_runs(RunQuery(tag="under_score"))] == ["a"]
    assert [r.id for r in await store.list_runs(RunQuery(tags=["50", "50%"]))] == ["b", "a"]
    await store.update_run("a", {"tags": None})
    assert await store.list_runs(RunQuery(tag="50%")) == []
    run = await store.get_run("a")
    assert run is not None and run.tags is None


# ------------------------------------------------------------------ misc semantics


async def test_update_of_a_missing_run_writes_nothing(store: SqlStateStore) -> None:
    await store.update_run("ghost", {"status": "completed"})
    await store.update_run("ghost", {"tags": ("t",), "search_attributes": {"k": 1}})
    for table in ("durable_workflow_runs", "durable_run_tags", "durable_run_attributes"):
        assert await raw(store, f"SELECT count(*) FROM {table}") == [(0,)]


async def test_bulk_leases(store: SqlStateStore) -> None:
    for i in range(4):
        await store.create_run(make_run(f"r{i}"))
    for i in range(3):
        assert await try_lock(store, f"r{i}", "A", 1_000, 0)
    assert await try_lock(store, "r3", "B", 1_000, 0)
    assert await store.renew_run_locks("A", 5_000) == 3
    runs = {r.id: r for r in await store.list_runs(RunQuery())}
    assert [runs[f"r{i}"].locked_until for i in range(4)] == [5_000, 5_000, 5_000, 1_000]
    assert await store.release_locks_of("A") == 3
    assert await store.release_locks_of("A") == 0
    runs = {r.id: r for r in await store.list_runs(RunQuery())}
    assert runs["r0"].locked_by is None and runs["r0"].locked_until is None
    assert runs["r3"].locked_by == "B"
    # boundary inclusive: a lease ending exactly now is expired
    claimed = await store.claim_run("r3", "C", 2_000, 1_000)
    assert claimed is not None and claimed.locked_by == "C" and claimed.id == "r3"
    assert await store.claim_run("missing", "C", 2_000, 1_000) is None


async def test_attribute_pushdown_with_paging(store: SqlStateStore) -> None:
    for i in range(30):
        await store.create_run(
            make_run(
                f"r{i:02d}",
                status="running" if i % 2 else "completed",
                created_at=at(i),
                search_attributes={"n": i, "vip": i % 3 == 0, "tier": "pro" if i < 10 else "x"},
            )
        )
    query = RunQuery(
        attributes=[AttributeFilter("n", "gte", 5), AttributeFilter("vip", "eq", True)],
        status="running",
        limit=2,
        offset=1,
    )
    assert [r.id for r in await store.list_runs(query)] == ["r21", "r15"]
    assert await store.count_runs(query) == 4  # r09, r15, r21, r27: paging ignored
    mixed = RunQuery(attributes=[AttributeFilter("n", "in", values=(3, "3", True, 4.0))])
    assert [r.id for r in await store.list_runs(mixed)] == ["r04", "r03"]
    empty = RunQuery(attributes=[AttributeFilter("n", "in", values=())])
    assert await store.list_runs(empty) == []


async def test_buffered_events_order_and_claim(store: SqlStateStore) -> None:
    await store.buffer_event(BufferedEvent("e2", "evt", {"a": 1}, 20))
    await store.buffer_event(BufferedEvent("e1", "evt", None, 20))
    await store.buffer_event(BufferedEvent("e0", "evt", [1], 10))
    await store.buffer_event(BufferedEvent("x", "other", 1, 0))
    listed = await store.list_buffered_events("evt", 10)
    assert [e.id for e in listed] == ["e0", "e1", "e2"]
    assert [e.id for e in await store.list_buffered_events("evt", 2)] == ["e0", "e1"]
    assert await store.remove_buffered_event("e1") is True
    assert await store.remove_buffered_event("e1") is False
    assert [e.id for e in await store.list_buffered_events("evt", 10)] == ["e0", "e2"]


# ------------------------------------------------------------------ errors and PostgreSQL SQL


async def test_duplicate_create_raises_integrity_error(store: SqlStateStore) -> None:
    from sqlalchemy.exc import IntegrityError

    await store.create_run(make_run())
    with pytest.raises(IntegrityError):
        await store.create_run(make_run())
    with pytest.raises(IntegrityError):
        await store.create_run(make_run(tags=("a",)))  # the transactional path
    await store.buffer_event(BufferedEvent("e", "n", None, 1))
    with pytest.raises(IntegrityError):
        await store.buffer_event(BufferedEvent("e", "n", None, 1))
    # the writer connection is still healthy
    await store.update_run("r1", {"status": "completed"})
    run = await store.get_run("r1")
    assert run is not None and run.status == "completed" and run.tags is None


def test_every_statement_compiles_for_postgresql() -> None:
    """No PostgreSQL server here: at least prove the SQL renders for the PG dialect."""
    from durably._store.sql.dialect import offline_dialect
    from durably._store.sql.predicates import run_query_predicates

    pg_dialect = offline_dialect("postgresql")

    statements = Statements(SqlDialect("postgresql"))
    rendered = {}
    for name, value in vars(statements).items():
        if name != "dialect":
            for stmt in value if isinstance(value, tuple) else (value,):
                if stmt is not None:
                    rendered[name] = str(stmt.compile(dialect=pg_dialect))
    assert "ON CONFLICT (run_id, seq) DO UPDATE" in rendered["save_cp"]
    assert "FOR UPDATE SKIP LOCKED" in rendered["take_signal"]
    assert "RETURNING" in rendered["claim"] and "RETURNING" in rendered["take_waiters_in"]
    assert "FOR UPDATE" in rendered["pending_keys"]
    claim = rendered["claim_pending"]  # the last namespace variant: `namespace = :ns`
    assert claim.startswith("UPDATE durable_workflow_runs SET locked_by=")
    # `id = ANY(ARRAY(pick))`, not `id IN (pick)`: see statements.py
    assert "WHERE durable_workflow_runs.id = ANY (array((SELECT" in claim
    assert "FOR UPDATE SKIP LOCKED" in claim and "RETURNING" in claim
    query = RunQuery(
        workflows=["a"],
        statuses=["running", "failed"],
        tags=["x", "y"],
        namespace="default",
        origins=["p", None],
        attributes=[AttributeFilter("k", "in", values=(1, "1", True))],
        limit=5,
        offset=2,
    )
    import sqlalchemy as sa

    from durably._store.sql.schema import runs

    stmt = sa.select(runs.c.id).where(*run_query_predicates(query)).limit(5).offset(2)
    sql = str(stmt.compile(dialect=pg_dialect))
    assert sql.count("EXISTS") == 2 and "LIMIT" in sql and "origin IS NULL" in sql
    empty = sa.select(runs.c.id).where(*run_query_predicates(RunQuery(tags=[])))
    assert "WHERE false" in str(empty.compile(dialect=pg_dialect))
