"""State-store cases: run facets, value facets and lease owners."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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

from .base import StoreCases
from .support import at, make_run, try_lock


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


class FacetCases(StoreCases):
    """The facets cases of the state-store suite."""

    async def test_stores_declare_the_facet_protocols(self, store: Any) -> None:
        assert isinstance(store, StateStore)
        assert callable(store.run_facets) and callable(store.lease_owners)

    async def test_run_facets_whole_set_and_blank_origins_fold(self, store: Any) -> None:
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

    async def test_run_facets_ignore_page_and_counted_axes(self, store: Any) -> None:
        await seed(store)
        whole = cells(await store.run_facets(RunQuery()))
        q = RunQuery(limit=1, offset=2, status="running", statuses=["failed"], origin="pkg")
        assert cells(await store.run_facets(q)) == whole
        assert cells(await store.run_facets(RunQuery(origins=["nope"]))) == whole
        assert len(await store.list_runs(RunQuery(limit=1))) == 1

    async def test_run_facets_narrow_like_the_list(self, store: Any) -> None:
        await seed(store)
        assert cells(await store.run_facets(RunQuery(namespace="acme"))) == {
            ("running", "pkg", 1),
            ("completed", None, 2),
        }
        assert cells(await store.run_facets(RunQuery(namespace="default"))) == {
            ("pending", " pkg ", 1)
        }
        assert cells(await store.run_facets(RunQuery(tag="etl"))) == {
            ("running", "pkg", 1),
            ("completed", None, 1),
        }
        attrs = [AttributeFilter("tier", "eq", "pro")]
        assert cells(await store.run_facets(RunQuery(attributes=attrs))) == {
            ("running", "pkg", 1),
            ("running", None, 1),
        }
        assert cells(await store.run_facets(RunQuery(workflow="refund"))) == {
            ("pending", " pkg ", 1)
        }
        assert await store.run_facets(RunQuery(tags=[])) == []
        assert await store.run_facets(RunQuery(namespace="nobody")) == []

    async def test_value_facets_column_axes(self, store: Any) -> None:
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
        assert vals(await store.run_value_facets("status", paged)) == [
            ("completed", 2),
            ("running", 1),
        ]

    async def test_value_facets_tags_and_attributes(self, store: Any) -> None:
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

    async def test_value_facets_scan_window_is_the_newest_runs(self, store: Any) -> None:
        for i in range(5):
            tag = "old" if i < 3 else "new"
            await store.create_run(make_run(f"r{i}", tags=(tag,), created_at=at(i)))
        window = RunValueFacetOptions(scan=2)
        assert vals(await store.run_value_facets("tag", RunQuery(), window)) == [("new", 2)]
        assert vals(await store.run_value_facets("tag", RunQuery())) == [("old", 3), ("new", 2)]

    async def test_lease_owners_group_live_leases(self, store: Any) -> None:
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
