"""StateStore conformance: run listing and counting, search-attribute filters and the
shared query helpers.

Each store test takes the parametrized `store` fixture (see conftest.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from durably import AttributeFilter, RunQuery
from durably._store.query import (
    AttributeRow,
    attribute_predicate_operands,
    matches_attributes,
    matches_query,
    normalize_attribute_rows,
)

from .support import ConformantStore, at, attr, id_set, ids, make_run, seed_attrs

# ================================================================== Listing


async def _seed_listing(store: ConformantStore) -> None:
    rows = [
        ("l1", "checkout", "running", "acme", "pkg-a", ("etl", "singleton:k")),
        ("l2", "checkout", "completed", "acme", None, ("etl-foo",)),
        ("l3", "refund", "running", "default", "pkg-b", None),
        ("l4", "refund", "dead", "acme", "pkg-a", ("x",)),
        ("l5", "checkout", "suspended", "beta", None, ("etl", "x")),
    ]
    for minute, (run_id, wf, status, ns, origin, tags) in enumerate(rows):
        await store.create_run(
            make_run(
                run_id,
                workflow=wf,
                status=status,
                namespace=ns,
                origin=origin,
                tags=tags,
                created_at=at(minute),
            )
        )


async def test_list_runs_workflow_and_status_filters(store: ConformantStore) -> None:
    await _seed_listing(store)
    assert await id_set(store, RunQuery(workflow="checkout")) == {"l1", "l2", "l5"}
    assert await id_set(store, RunQuery(status="running")) == {"l1", "l3"}
    assert await id_set(store, RunQuery(workflow="refund", status="running")) == {"l3"}
    assert await id_set(store, RunQuery(workflow="nope")) == set()


async def test_list_runs_status_sets(store: ConformantStore) -> None:
    await _seed_listing(store)
    assert await id_set(store, RunQuery(statuses=["running", "suspended"])) == {"l1", "l3", "l5"}
    both = RunQuery(status="running", statuses=["running", "suspended"])
    assert await id_set(store, both) == {"l1", "l3"}
    disjoint = RunQuery(status="dead", statuses=["running", "suspended"])
    assert await id_set(store, disjoint) == set()
    assert await ids(store, RunQuery(statuses=[])) == []


async def test_list_runs_exact_tag(store: ConformantStore) -> None:
    await _seed_listing(store)
    await store.create_run(make_run("sp", tags=('quo"te', "50%", "a_b")))
    assert await id_set(store, RunQuery(tag="etl")) == {"l1", "l5"}  # not etl-foo
    assert await id_set(store, RunQuery(tag="etl-foo")) == {"l2"}
    assert await id_set(store, RunQuery(tag="nope")) == set()
    assert await id_set(store, RunQuery(tag="et")) == set()
    assert await id_set(store, RunQuery(tag='quo"te')) == {"sp"}
    assert await id_set(store, RunQuery(tag="50%")) == {"sp"}
    assert await id_set(store, RunQuery(tag="5%")) == set()
    assert await id_set(store, RunQuery(tag="a_b")) == {"sp"}
    assert await id_set(store, RunQuery(tag="axb")) == set()
    singleton = RunQuery(statuses=["running", "suspended"], tag="singleton:k")
    assert await ids(store, singleton) == ["l1"]


async def test_list_runs_tags_any_of(store: ConformantStore) -> None:
    await _seed_listing(store)
    assert await id_set(store, RunQuery(tags=["x", "etl-foo"])) == {"l2", "l4", "l5"}
    assert await id_set(store, RunQuery(tags=["etl"], tag="x")) == {"l5"}
    assert await ids(store, RunQuery(tags=[])) == []


async def test_list_runs_origin(store: ConformantStore) -> None:
    await _seed_listing(store)
    r4 = await store.get_run("l4")
    r2 = await store.get_run("l2")
    assert r4 is not None and r4.origin == "pkg-a"
    assert r2 is not None and r2.origin is None
    assert await id_set(store, RunQuery(origin="pkg-a")) == {"l1", "l4"}
    assert await id_set(store, RunQuery(origin="unknown")) == set()
    assert await id_set(store, RunQuery(origin=None)) == {"l2", "l5"}
    assert await id_set(store, RunQuery(origin=None, status="completed")) == {"l2"}
    assert await id_set(store, RunQuery()) == {"l1", "l2", "l3", "l4", "l5"}


async def test_list_runs_plural_sets(store: ConformantStore) -> None:
    await _seed_listing(store)
    assert await id_set(store, RunQuery(workflows=["refund"])) == {"l3", "l4"}
    assert await id_set(store, RunQuery(workflows=["refund", "checkout"])) == {
        "l1",
        "l2",
        "l3",
        "l4",
        "l5",
    }
    assert await id_set(store, RunQuery(namespaces=["acme", "beta"])) == {"l1", "l2", "l4", "l5"}
    assert await id_set(store, RunQuery(namespaces=["default"])) == {"l3"}
    ns_dead = RunQuery(namespaces=["acme"], statuses=["dead"])
    assert await id_set(store, ns_dead) == {"l4"}
    assert await id_set(store, RunQuery(origins=["pkg-a", None])) == {"l1", "l2", "l4", "l5"}
    assert await id_set(store, RunQuery(origins=["pkg-b"])) == {"l3"}
    assert await id_set(store, RunQuery(origins=[None])) == {"l2", "l5"}
    for empty in (
        RunQuery(namespaces=[]),
        RunQuery(statuses=[]),
        RunQuery(origins=[]),
        RunQuery(tags=[]),
        RunQuery(workflows=[]),
    ):
        assert await ids(store, empty) == []


async def test_list_runs_newest_first_with_paging(store: ConformantStore) -> None:
    await store.create_run(make_run("old", created_at=at(0)))
    await store.create_run(make_run("new", created_at=at(2)))
    await store.create_run(make_run("mid", created_at=at(1)))
    assert await ids(store, RunQuery()) == ["new", "mid", "old"]
    assert await ids(store, RunQuery(limit=2, offset=1)) == ["mid", "old"]
    assert await ids(store, RunQuery(limit=1)) == ["new"]
    assert await ids(store, RunQuery(offset=2)) == ["old"]
    assert await ids(store, RunQuery(offset=5)) == []
    assert await ids(store, RunQuery(limit=0)) == []
    # ties by id DESC
    await store.create_run(make_run("tie-a", created_at=at(5)))
    await store.create_run(make_run("tie-b", created_at=at(5)))
    assert await ids(store, RunQuery(limit=2)) == ["tie-b", "tie-a"]


async def test_count_runs(store: ConformantStore) -> None:
    await _seed_listing(store)
    assert await store.count_runs(RunQuery()) == 5
    assert await store.count_runs(RunQuery(workflow="checkout")) == 3
    assert await store.count_runs(RunQuery(workflow="checkout", limit=1, offset=1)) == 3
    assert await store.count_runs(RunQuery(statuses=[])) == 0
    assert await store.count_runs(RunQuery(namespace="acme", origin=None)) == 1
    assert await store.count_runs(RunQuery(tag="etl")) == 2


# ================================================================== Search attributes


async def test_attributes_eq_range_and_anded(store: ConformantStore) -> None:
    await seed_attrs(store)
    assert await id_set(store, attr("tier", "eq", "pro")) == {"b", "c"}
    assert await id_set(store, attr("amount", "gt", 10)) == {"b", "c"}
    assert await id_set(store, attr("amount", "gte", 10)) == {"a", "b", "c"}
    assert await id_set(store, attr("amount", "lt", 55.5)) == {"a"}
    assert await id_set(store, attr("amount", "lte", 55.5)) == {"a", "c"}
    assert await id_set(store, attr("amount", "eq", 10.0)) == {"a"}  # one number kind
    both = RunQuery(
        attributes=[AttributeFilter("tier", "eq", "pro"), AttributeFilter("amount", "gt", 100)]
    )
    assert await ids(store, both) == ["b"]
    # `ne` excludes runs that lack the key
    assert await id_set(store, attr("tier", "ne", "pro")) == {"a", "d"}
    assert await id_set(store, attr("amount", "ne", 10)) == {"b", "c"}


async def test_attributes_string_ranges_and_kind_mismatch(store: ConformantStore) -> None:
    await seed_attrs(store)
    assert await id_set(store, attr("tier", "gt", "free")) == {"b", "c"}  # 'pro' > 'free'
    assert await id_set(store, attr("tier", "lt", "f")) == {"d"}  # 'enterprise'
    assert await id_set(store, attr("tier", "gt", 0)) == set()  # number vs string column
    assert await id_set(store, attr("amount", "gt", "0")) == set()
    assert await id_set(store, attr("amount", "eq", "10")) == set()


async def test_attributes_boolean_eq_ne_and_strict_types(store: ConformantStore) -> None:
    await seed_attrs(store)
    assert await ids(store, attr("vip", "eq", True)) == ["a"]
    assert await ids(store, attr("vip", "ne", True)) == ["b"]
    assert await ids(store, attr("vip", "eq", False)) == ["b"]
    await store.create_run(make_run("one", search_attributes={"flag": 1, "code": "1"}))
    await store.create_run(make_run("yes", search_attributes={"flag": True, "code": 1}))
    assert await ids(store, attr("flag", "eq", True)) == ["yes"]  # True != 1
    assert await ids(store, attr("flag", "eq", 1)) == ["one"]
    assert await ids(store, attr("code", "eq", "1")) == ["one"]  # '1' != 1
    assert await ids(store, attr("code", "eq", 1)) == ["yes"]


@pytest.mark.parametrize("op", ["eq", "ne", "gt", "gte", "lt", "lte"])
async def test_attributes_absent_key_matches_nothing(store: ConformantStore, op: Any) -> None:
    await seed_attrs(store)
    assert await ids(store, attr("missing", op, 1)) == []
    assert await ids(store, attr("missing", op, "x")) == []
    assert await ids(store, attr("missing", "in", values=(1, "x", True))) == []


async def test_attributes_in_mixed_types_and_empty(store: ConformantStore) -> None:
    await seed_attrs(store)
    assert await ids(store, attr("amount", "in", values=(200, "none"))) == ["b"]
    assert await id_set(store, attr("tier", "in", values=("free", "enterprise", 3))) == {"a", "d"}
    assert await ids(store, attr("vip", "in", values=(False, "nope"))) == ["b"]
    assert await ids(store, attr("tier", "in", values=())) == []


async def test_attributes_reindexed_on_update(store: ConformantStore) -> None:
    await seed_attrs(store)
    await store.update_run("a", {"search_attributes": {"tier": "pro"}})
    assert await ids(store, attr("tier", "eq", "free")) == []
    assert await ids(store, attr("amount", "eq", 10)) == []
    assert await id_set(store, attr("tier", "eq", "pro")) == {"a", "b", "c"}
    await store.update_run("b", {"search_attributes": None})
    assert await id_set(store, attr("tier", "eq", "pro")) == {"a", "c"}
    # a patch without search_attributes keeps the rows
    await store.update_run("c", {"status": "failed"})
    assert await id_set(store, attr("tier", "eq", "pro")) == {"a", "c"}
    await store.update_run("e", {"search_attributes": {"tier": "pro"}})
    assert await id_set(store, attr("tier", "eq", "pro")) == {"a", "c", "e"}


async def test_attributes_with_status_and_limit(store: ConformantStore) -> None:
    await seed_attrs(store)
    q = RunQuery(
        attributes=[AttributeFilter("tier", "ne", "x")], status="running", limit=2, offset=0
    )
    assert await ids(store, q) == ["d", "b"]
    q2 = RunQuery(attributes=[AttributeFilter("tier", "ne", "x")], status="running", offset=2)
    assert await ids(store, q2) == ["a"]
    assert await store.count_runs(RunQuery(attributes=[AttributeFilter("tier", "ne", "x")])) == 4


# ================================================================== shared helpers


def test_query_helpers_normalize_attribute_rows() -> None:
    rows = normalize_attribute_rows("r1", {"vip": True, "off": False, "n": 3, "s": "x"})
    assert rows == [
        AttributeRow("r1", "vip", "true", None),
        AttributeRow("r1", "off", "false", None),
        AttributeRow("r1", "n", None, 3.0),
        AttributeRow("r1", "s", "x", None),
    ]
    assert normalize_attribute_rows("r1", None) == []
    assert normalize_attribute_rows("r1", {}) == []


def test_query_helpers_attribute_predicate_operands() -> None:
    assert attribute_predicate_operands(AttributeFilter("a", "gt", 5)) == [("num_value", ">", 5.0)]
    assert attribute_predicate_operands(AttributeFilter("a", "ne", True)) == [
        ("str_value", "<>", "true")
    ]
    assert attribute_predicate_operands(AttributeFilter("a", "lte", "m")) == [
        ("str_value", "<=", "m")
    ]
    assert attribute_predicate_operands(AttributeFilter("a", "in", values=(200, "none"))) == [
        ("num_value", "=", 200.0),
        ("str_value", "=", "none"),
    ]
    assert attribute_predicate_operands(AttributeFilter("a", "in", values=())) == []


def test_query_helpers_matches_query_and_attributes() -> None:
    run = make_run(namespace="default", origin=None, tags=("etl",), search_attributes={"n": 1})
    assert matches_query(run, RunQuery())
    assert matches_query(run, RunQuery(namespace="default", origin=None, tag="etl"))
    assert not matches_query(run, RunQuery(origin="pkg"))
    assert not matches_query(run, RunQuery(tags=[]))
    assert matches_attributes(run, [AttributeFilter("n", "eq", 1)])
    assert not matches_attributes(run, [AttributeFilter("n", "eq", True)])
    assert not matches_attributes(run, [AttributeFilter("m", "ne", 1)])
    assert matches_attributes(run, None)
    legacy = make_run(namespace=None)
    assert matches_query(legacy, RunQuery(namespace="default"))
    assert not matches_query(legacy, RunQuery(namespace="acme"))
