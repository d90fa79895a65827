"""State-store cases: run listing and counting, and search-attribute filters."""

from __future__ import annotations

from typing import Any

import pytest

from durably import AttributeFilter, RunQuery, StateStore

from .base import StoreCases
from .support import at, attr, id_set, ids, make_run, seed_attrs


async def _seed_listing(store: StateStore) -> None:
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


class ListingCases(StoreCases):
    """The listing cases of the state-store suite."""

    async def test_list_runs_workflow_and_status_filters(self, store: StateStore) -> None:
        await _seed_listing(store)
        assert await id_set(store, RunQuery(workflow="checkout")) == {"l1", "l2", "l5"}
        assert await id_set(store, RunQuery(status="running")) == {"l1", "l3"}
        assert await id_set(store, RunQuery(workflow="refund", status="running")) == {"l3"}
        assert await id_set(store, RunQuery(workflow="nope")) == set()

    async def test_list_runs_status_sets(self, store: StateStore) -> None:
        await _seed_listing(store)
        assert await id_set(store, RunQuery(statuses=["running", "suspended"])) == {
            "l1",
            "l3",
            "l5",
        }
        both = RunQuery(status="running", statuses=["running", "suspended"])
        assert await id_set(store, both) == {"l1", "l3"}
        disjoint = RunQuery(status="dead", statuses=["running", "suspended"])
        assert await id_set(store, disjoint) == set()
        assert await ids(store, RunQuery(statuses=[])) == []

    async def test_list_runs_exact_tag(self, store: StateStore) -> None:
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

    async def test_list_runs_tags_any_of(self, store: StateStore) -> None:
        await _seed_listing(store)
        assert await id_set(store, RunQuery(tags=["x", "etl-foo"])) == {"l2", "l4", "l5"}
        assert await id_set(store, RunQuery(tags=["etl"], tag="x")) == {"l5"}
        assert await ids(store, RunQuery(tags=[])) == []

    async def test_list_runs_origin(self, store: StateStore) -> None:
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

    async def test_list_runs_plural_sets(self, store: StateStore) -> None:
        await _seed_listing(store)
        assert await id_set(store, RunQuery(workflows=["refund"])) == {"l3", "l4"}
        assert await id_set(store, RunQuery(workflows=["refund", "checkout"])) == {
            "l1",
            "l2",
            "l3",
            "l4",
            "l5",
        }
        assert await id_set(store, RunQuery(namespaces=["acme", "beta"])) == {
            "l1",
            "l2",
            "l4",
            "l5",
        }
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

    async def test_list_runs_newest_first_with_paging(self, store: StateStore) -> None:
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

    async def test_count_runs(self, store: StateStore) -> None:
        await _seed_listing(store)
        assert await store.count_runs(RunQuery()) == 5
        assert await store.count_runs(RunQuery(workflow="checkout")) == 3
        assert await store.count_runs(RunQuery(workflow="checkout", limit=1, offset=1)) == 3
        assert await store.count_runs(RunQuery(statuses=[])) == 0
        assert await store.count_runs(RunQuery(namespace="acme", origin=None)) == 1
        assert await store.count_runs(RunQuery(tag="etl")) == 2

    async def test_attributes_eq_range_and_anded(self, store: StateStore) -> None:
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

    async def test_attributes_string_ranges_and_kind_mismatch(self, store: StateStore) -> None:
        await seed_attrs(store)
        assert await id_set(store, attr("tier", "gt", "free")) == {"b", "c"}  # 'pro' > 'free'
        assert await id_set(store, attr("tier", "lt", "f")) == {"d"}  # 'enterprise'
        assert await id_set(store, attr("tier", "gt", 0)) == set()  # number vs string column
        assert await id_set(store, attr("amount", "gt", "0")) == set()
        assert await id_set(store, attr("amount", "eq", "10")) == set()

    async def test_attributes_boolean_eq_ne_and_strict_types(self, store: StateStore) -> None:
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
    async def test_attributes_absent_key_matches_nothing(self, store: StateStore, op: Any) -> None:
        await seed_attrs(store)
        assert await ids(store, attr("missing", op, 1)) == []
        assert await ids(store, attr("missing", op, "x")) == []
        assert await ids(store, attr("missing", "in", values=(1, "x", True))) == []

    async def test_attributes_in_mixed_types_and_empty(self, store: StateStore) -> None:
        await seed_attrs(store)
        assert await ids(store, attr("amount", "in", values=(200, "none"))) == ["b"]
        assert await id_set(store, attr("tier", "in", values=("free", "enterprise", 3))) == {
            "a",
            "d",
        }
        assert await ids(store, attr("vip", "in", values=(False, "nope"))) == ["b"]
        assert await ids(store, attr("tier", "in", values=())) == []

    async def test_attributes_reindexed_on_update(self, store: StateStore) -> None:
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

    async def test_attributes_with_status_and_limit(self, store: StateStore) -> None:
        await seed_attrs(store)
        q = RunQuery(
            attributes=[AttributeFilter("tier", "ne", "x")], status="running", limit=2, offset=0
        )
        assert await ids(store, q) == ["d", "b"]
        q2 = RunQuery(attributes=[AttributeFilter("tier", "ne", "x")], status="running", offset=2)
        assert await ids(store, q2) == ["a"]
        assert (
            await store.count_runs(RunQuery(attributes=[AttributeFilter("tier", "ne", "x")])) == 4
        )
