"""What only the SQL store can show about the contract (on SQLite and PostgreSQL; the
`memory` case of the conftest's `store` fixture is skipped): rows written by hand, query plans
and rows sent back, a linguistic collation.

Each test takes the parametrized `store` fixture of conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from durably import AttributeFilter, RunQuery
from durably._core.aggregates import checkpoint_stats_of
from durably._core.models import ms_from_utc
from durably.testing.conformance.state_store.activity import cells as activity_cells
from durably.testing.conformance.state_store.activity import window as activity_window
from durably.testing.conformance.state_store.aggregates import (
    NAMES_FAN,
    STEP_FAN,
    by_key,
    seed,
    sorted_stats,
)
from durably.testing.conformance.state_store.facets import cells, vals
from durably.testing.conformance.state_store.fleet import beat
from tests.store.support import T0, at, make_run


def _sql(store: Any) -> Any:
    if not hasattr(store, "dialect"):
        pytest.skip("SQL stores only")
    return store


def _count_rows(store: Any) -> Callable[[], list[int]]:
    """Wrap the store's one read path: how many rows each statement sent back."""
    seen: list[int] = []
    inner = store._runner.read_all

    async def counting(stmt: Any, params: Any = None, *, point: bool = False) -> Any:
        found = await inner(stmt, params, point=point)
        seen.append(len(found))
        return found

    store._runner.read_all = counting
    return lambda: seen


async def _bulk_seed(store: Any, n: int = 300) -> None:
    for i in range(n):
        tags = ("needle",) if i % 100 == 7 else ("hay", f"t{i % 10}")
        attrs: dict[str, Any] = {"amount": i, "tier": "pro" if i % 50 == 3 else "free"}
        await store.create_run(make_run(f"b{i:04d}", tags=tags, search_attributes=attrs))


async def _plan(store: Any, stmt: sa.Select[Any]) -> str:
    compiled = stmt.compile(dialect=store.engine.dialect, compile_kwargs={"literal_binds": True})
    if store.dialect.is_sqlite:
        rows = await store._runner.read_all(sa.text(f"EXPLAIN QUERY PLAN {compiled}"))
        return "\n".join(str(row[-1]) for row in rows)

    async def work(s: Any) -> Any:
        await s.sql("SET LOCAL enable_seqscan = off")  # the plan with indexes available
        return await s.fetch(sa.text(f"EXPLAIN {compiled}"))

    rows = await store._cx.read(work)
    return "\n".join(str(row[0]) for row in rows)


async def test_sql_checkpoint_stats_read_a_null_enqueued_at_as_started_at(store: Any) -> None:
    """An old row without `enqueued_at` (only SQL can hold one): `minEnqueuedAt` is
    `MIN(COALESCE(enqueued_at, started_at))`, as `list_checkpoints` reads the row."""
    if not hasattr(store, "engine"):
        pytest.skip("SQL stores only: the in-memory store never holds a NULL enqueued_at")
    await seed(store)
    from durably._store.sql.schema import checkpoints

    c = checkpoints.c
    async with store.engine.begin() as conn:
        await conn.execute(
            sa.update(checkpoints)
            .where(c.run_id == "r1", c.seq.in_([2, 3]))
            .values(enqueued_at=None)
        )
    stat = by_key(await store.checkpoint_stats("r1"))[(STEP_FAN, "completed", "step")]
    assert stat.min_enqueued_at == at(2, ms=2)  # seq 2's started_at
    reference = checkpoint_stats_of(await store.list_checkpoints("r1"))
    assert sorted_stats(await store.checkpoint_stats("r1")) == sorted_stats(reference)


async def test_postgres_min_max_name_by_code_point_under_a_linguistic_collation(
    store: Any,
) -> None:
    """A database whose text collates linguistically (ICU `en`: punctuation ignored, case
    folded at the first level) still answers `minName`/`maxName` by code point, like the
    in-memory reference (the store asks for `COLLATE "C"`)."""
    if getattr(getattr(store, "engine", None), "dialect", None) is None or (
        store.engine.dialect.name != "postgresql"
    ):
        pytest.skip("PostgreSQL only")
    alter = "ALTER TABLE durable_step_checkpoints ALTER COLUMN name TYPE text COLLATE "
    async with store.engine.begin() as conn:
        await conn.execute(sa.text(alter + '"en-x-icu"'))
    await seed(store)
    names = by_key(await store.checkpoint_stats("r1"))[(NAMES_FAN, "completed", "step")]
    assert (names.min_name, names.max_name) == ("Zeta", "stepa")
    reference = checkpoint_stats_of(await store.list_checkpoints("r1"))
    assert sorted_stats(await store.checkpoint_stats("r1")) == sorted_stats(reference)
    async with store.engine.connect() as conn:  # the column's own order differs
        plain = (
            await conn.execute(
                sa.text(
                    "SELECT min(name), max(name) FROM durable_step_checkpoints"
                    " WHERE run_id = 'r1' AND parallel_group = :g"
                ),
                {"g": NAMES_FAN},
            )
        ).one()
    assert tuple(plain) != ("Zeta", "stepa")


async def test_sql_tag_and_attribute_filters_send_back_only_matches(store: Any) -> None:
    """Filtering happens in the database: of 300 runs, the statement returns the 3 tagged
    `needle` (6 `tier=pro`, 2 with both) — never the 300 rows to filter in Python."""
    sql = _sql(store)
    await _bulk_seed(sql)
    seen = _count_rows(sql)
    assert len(await sql.list_runs(RunQuery(tag="needle"))) == 3
    pro = [AttributeFilter("tier", "eq", "pro")]
    assert len(await sql.list_runs(RunQuery(attributes=pro))) == 6
    both = RunQuery(tag="needle", attributes=[AttributeFilter("amount", "gte", 200)])
    assert len(await sql.list_runs(both)) == 1
    assert await sql.count_runs(RunQuery(tag="needle", attributes=pro)) == 0
    facets = await sql.run_facets(RunQuery(attributes=pro))
    assert cells(facets) == {("running", None, 6)}
    values = await sql.run_value_facets("tag", RunQuery(tag="needle"))
    assert vals(values) == [("needle", 3)]
    assert seen() == [3, 6, 1, 1, 1, 1]  # rows sent back per statement


async def test_sql_query_plans_use_the_side_table_indexes(store: Any) -> None:
    """EXPLAIN of the list/count/facet statements: the tag and attribute predicates are
    index lookups on `durable_run_tags` / `durable_run_attributes` inside the statement."""
    from durably._store.sql.facets import run_facets_statement
    from durably._store.sql.predicates import run_query_predicates
    from durably._store.sql.schema import runs

    sql = _sql(store)
    await _bulk_seed(sql, 50)
    tag_indexes = (
        "durable_run_tags_tag_idx",
        "sqlite_autoindex_durable_run_tags",
        "durable_run_tags_pkey",
    )
    attr_indexes = (
        "durable_run_attributes_key_num_idx",
        "durable_run_attributes_key_str_idx",
        "sqlite_autoindex_durable_run_attributes",
        "durable_run_attributes_pkey",
    )
    by_tag = RunQuery(tag="needle")
    by_attr = RunQuery(attributes=[AttributeFilter("amount", "gte", 40)])
    for query, indexes in ((by_tag, tag_indexes), (by_attr, attr_indexes)):
        listed = sa.select(runs.c.id).where(*run_query_predicates(query))
        counted = sa.select(sa.func.count()).select_from(runs).where(*run_query_predicates(query))
        for stmt in (listed, counted, run_facets_statement(query)):
            plan = await _plan(sql, stmt)
            assert any(name in plan for name in indexes), plan


@pytest.mark.parametrize(
    "info",
    [
        "not json",
        "[1, 2]",
        '{"workflows": "x", "steps": [1, null, "ok"], "tokens": 7}',
    ],
)
async def test_a_row_written_by_hand_is_read_leniently(store: Any, info: str) -> None:
    """A row anyone could write (psql): unreadable `info` skips the row; wrong-typed lists
    read as empty, odd members are dropped. Only the SQL stores take a raw row."""
    engine = getattr(store, "engine", None)
    if engine is None:
        pytest.skip("the memory store has no raw rows to write by hand")
    await store.beat_worker(beat("good", 1_000))
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO durable_worker_beats (namespace, instance_id, beat_at, started_at,"
                " info) VALUES ('default', 'odd', 2000, 2000, :info)"
            ),
            {"info": info},
        )
    rows = {r.instance_id: r for r in await store.list_worker_beats("default", 0, 100)}
    assert "good" in rows
    if info.startswith("{"):
        odd = rows["odd"]
        assert odd.workflows == ()
        assert odd.steps == ("ok",)
        assert odd.tokens is None
    else:
        assert "odd" not in rows


async def test_sql_run_activity_sends_back_one_row_per_bucket(store: Any) -> None:
    sql = _sql(store)
    for i in range(200):
        await sql.create_run(
            make_run(f"b{i}", status="completed", created_at=at(0, ms=i), updated_at=at(1))
        )
    seen = _count_rows(sql)
    rows = await sql.run_activity(RunQuery(), activity_window())
    assert activity_cells(rows) == [
        (ms_from_utc(T0), 200, 0, 0),
        (ms_from_utc(T0) + 60_000, 0, 200, 0),
    ]
    assert seen() == [1, 1]  # one GROUP BY row per bucket and series, not 400 runs


async def test_sql_run_activity_reads_the_window_through_indexes(store: Any) -> None:
    """EXPLAIN of both statements: the window is a range on an index (`created_at` for the
    starts, `(status, updated_at)` for the settled runs), never a scan of every run."""
    from durably._store.sql.facets import run_activity_statements

    sql = _sql(store)
    for i in range(50):
        await sql.create_run(make_run(f"p{i}", status="completed", created_at=at(i)))
    started, settled = run_activity_statements(RunQuery(), activity_window())
    started_plan = await _plan(sql, started)
    assert "durable_workflow_runs_created_at_idx" in started_plan, started_plan
    settled_plan = await _plan(sql, settled)
    assert "durable_workflow_runs_status_updated_at_idx" in settled_plan, settled_plan
