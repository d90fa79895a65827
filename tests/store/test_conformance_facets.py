"""Run facets, value facets and lease owners on every first-party store (memory, SQLite,
PostgreSQL), plus proof that tag and search-attribute filters run in SQL (query plans and
rows sent back)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import sqlalchemy as sa

from durably import (
    AttributeFilter,
    RunFacetRow,
    RunQuery,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    StateStore,
)
from durably._read.list_models import LeaseOwnerRow
from tests.store.support import at, make_run, try_lock


def cells(rows: Sequence[RunFacetRow]) -> set[tuple[str, str | None, int]]:
    return {(r.status, r.origin, r.count) for r in rows}


def vals(rows: Sequence[RunValueFacetRow]) -> list[tuple[str | None, int]]:
    return [(r.value, r.count) for r in rows]


async def seed(store: Any) -> None:
    """Six runs over two namespaces, origins (incl. blank ones), tags and attributes."""
    runs = [
        make_run(
            "a1",
            namespace="acme",
            status="running",
            origin="pkg",
            tags=("etl", "nightly"),
            search_attributes={"tier": "pro", "amount": 200, "vip": True},
            created_at=at(1),
        ),
        make_run(
            "a2",
            namespace="acme",
            status="completed",
            origin=None,
            tags=("etl",),
            search_attributes={"tier": "free", "amount": 200.0},
            created_at=at(2),
        ),
        make_run("a3", namespace="acme", status="completed", origin="", created_at=at(3)),
        make_run(
            "g1",
            namespace="globex",
            status="running",
            origin="   ",
            tags=("adhoc",),
            search_attributes={"tier": "pro", "amount": 1.5},
            created_at=at(4),
        ),
        make_run("g2", namespace="globex", status="failed", origin="pkg", created_at=at(5)),
        make_run("d1", status="pending", origin=" pkg ", workflow="refund", created_at=at(6)),
    ]
    for run in runs:
        await store.create_run(run)


async def test_stores_declare_the_facet_protocols(store: Any) -> None:
    assert isinstance(store, StateStore)
    assert callable(store.run_facets) and callable(store.lease_owners)


# ------------------------------------------------------------------ run facets


async def test_run_facets_whole_set_and_blank_origins_fold(store: Any) -> None:
    await seed(store)
    got = await store.run_facets(RunQuery())
    assert cells(got) == {
        ("running", "pkg", 1),
        ("completed", None, 2),  # None and '' fold into one cell
        ("running", None, 1),  # '   ' is unattributed
        ("failed", "pkg", 1),
        ("pending", " pkg ", 1),  # kept unchanged
    }
    assert sum(r.count for r in got) == 6


async def test_run_facets_ignore_page_and_counted_axes(store: Any) -> None:
    await seed(store)
    whole = cells(await store.run_facets(RunQuery()))
    q = RunQuery(limit=1, offset=2, status="running", statuses=["failed"], origin="pkg")
    assert cells(await store.run_facets(q)) == whole
    assert cells(await store.run_facets(RunQuery(origins=["nope"]))) == whole
    assert len(await store.list_runs(RunQuery(limit=1))) == 1


async def test_run_facets_narrow_like_the_list(store: Any) -> None:
    await seed(store)
    assert cells(await store.run_facets(RunQuery(namespace="acme"))) == {
        ("running", "pkg", 1),
        ("completed", None, 2),
    }
    assert cells(await store.run_facets(RunQuery(namespace="default"))) == {("pending", " pkg ", 1)}
    assert cells(await store.run_facets(RunQuery(tag="etl"))) == {
        ("running", "pkg", 1),
        ("completed", None, 1),
    }
    attrs = [AttributeFilter("tier", "eq", "pro")]
    assert cells(await store.run_facets(RunQuery(attributes=attrs))) == {
        ("running", "pkg", 1),
        ("running", None, 1),
    }
    assert cells(await store.run_facets(RunQuery(workflow="refund"))) == {("pending", " pkg ", 1)}
    assert await store.run_facets(RunQuery(tags=[])) == []
    assert await store.run_facets(RunQuery(namespace="nobody")) == []


# ------------------------------------------------------------------ value facets


async def test_value_facets_column_axes(store: Any) -> None:
    await seed(store)
    ns = RunValueAxis("namespace")
    got = await store.run_value_facets(ns, RunQuery(namespaces=["acme", "globex"]))
    assert vals(got) == [("acme", 3), ("globex", 2)]
    one = await store.run_value_facets(ns, RunQuery(), RunValueFacetOptions(limit=1))
    assert vals(one) == [("acme", 3)]
    assert vals(await store.run_value_facets("status", RunQuery(namespace="acme"))) == [
        ("completed", 2),
        ("running", 1),
    ]
    assert vals(await store.run_value_facets({"field": "workflow"}, RunQuery())) == [
        ("checkout", 5),
        ("refund", 1),
    ]
    # origin: blank and NULL are one None bucket, which sorts after equal counts
    assert vals(await store.run_value_facets("origin", RunQuery())) == [
        (None, 3),
        ("pkg", 2),
        (" pkg ", 1),
    ]
    assert vals(await store.run_value_facets("origin", RunQuery(namespace="globex"))) == [
        ("pkg", 1),
        (None, 1),
    ]
    # the page of the list never narrows the counts
    paged = RunQuery(namespace="acme", limit=1, offset=1)
    assert vals(await store.run_value_facets("status", paged)) == [("completed", 2), ("running", 1)]


async def test_value_facets_tags_and_attributes(store: Any) -> None:
    await seed(store)
    assert vals(await store.run_value_facets("tag", RunQuery(namespace="acme"))) == [
        ("etl", 2),
        ("nightly", 1),
    ]
    assert vals(await store.run_value_facets("tag", RunQuery())) == [
        ("etl", 2),
        ("adhoc", 1),
        ("nightly", 1),
    ]
    assert vals(await store.run_value_facets("attributeKey", RunQuery(namespace="acme"))) == [
        ("amount", 2),
        ("tier", 2),
        ("vip", 1),
    ]
    tier = RunValueAxis("attributeValue", key="tier")
    assert vals(await store.run_value_facets(tier, RunQuery(namespace="acme"))) == [
        ("free", 1),
        ("pro", 1),
    ]
    amount = {"field": "attributeValue", "key": "amount"}
    # JS String(): 200 and 200.0 are both '200'; 1.5 stays '1.5'
    assert vals(await store.run_value_facets(amount, RunQuery())) == [("200", 2), ("1.5", 1)]
    vip = RunValueAxis("attributeValue", key="vip")
    assert vals(await store.run_value_facets(vip, RunQuery())) == [("true", 1)]
    missing = RunValueAxis("attributeValue", key="nope")
    assert await store.run_value_facets(missing, RunQuery()) == []
    # filters narrow the set being enumerated
    flt = RunQuery(attributes=[AttributeFilter("amount", "gte", 100)])
    assert vals(await store.run_value_facets("tag", flt)) == [("etl", 2), ("nightly", 1)]


async def test_value_facets_scan_window_is_the_newest_runs(store: Any) -> None:
    for i in range(5):
        tag = "old" if i < 3 else "new"
        await store.create_run(make_run(f"r{i}", tags=(tag,), created_at=at(i)))
    window = RunValueFacetOptions(scan=2)
    assert vals(await store.run_value_facets("tag", RunQuery(), window)) == [("new", 2)]
    assert vals(await store.run_value_facets("tag", RunQuery())) == [("old", 3), ("new", 2)]


# ------------------------------------------------------------------ lease owners


async def test_lease_owners_group_live_leases(store: Any) -> None:
    await seed(store)
    now = 1_000_000
    assert await try_lock(store, "a1", "eng-1", now + 500, now)
    assert await try_lock(store, "a2", "eng-1", now + 900, now)
    assert await try_lock(store, "g1", "eng-2", now + 300, now)
    assert await try_lock(store, "d1", "eng-3", now - 1, now - 10)  # expired
    got = await store.lease_owners(now)
    assert got == [
        LeaseOwnerRow("acme", "eng-1", 2, now + 900),
        LeaseOwnerRow("globex", "eng-2", 1, now + 300),
    ]
    assert await store.lease_owners(now, "globex") == [
        LeaseOwnerRow("globex", "eng-2", 1, now + 300)
    ]
    assert await store.lease_owners(now - 100, "default") == [
        LeaseOwnerRow("default", "eng-3", 1, now - 1)
    ]


# ------------------------------------------------------------------ pushdown: filters run in SQL


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
