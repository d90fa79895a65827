"""Run lists, waiting descriptors, facets, value facets and worker health: the pure helpers
and the functions the Engine's read API calls."""

from __future__ import annotations

import base64

import pytest

from durably import (
    AttributeFilter,
    GroupHealth,
    InMemoryStateStore,
    RunFacetRow,
    RunQuery,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    RunWaiting,
    SignalWaiter,
)
from durably._core.models import UNSET
from durably._read.list_models import RunListItem
from durably._read.lists import (
    LocalWorker,
    as_run_query,
    axis_is_run_column,
    classify_waiter_token,
    count_runs,
    facet_origin,
    facet_query,
    index_waiters_by_run,
    js_string,
    list_run_items,
    merge_run_facet_rows,
    merge_run_value_facet_rows,
    resolve_run_waiting,
    run_facets,
    run_value_facets,
    run_value_facets_from_runs,
    waiting_for,
    worker_health,
)
from tests.store.support import at, make_run, try_lock


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# ------------------------------------------------------------------ classification


@pytest.mark.parametrize(
    ("token", "on", "name"),
    [
        ("wh:abc", "webhook", "wh:abc"),
        ("bp:r1:4", "breakpoint", "breakpoint"),
        ("child:r2", "child", "r2"),
        (f"event:{b64('order.paid')}:{b64('{}')}:r1#3", "signal", "order.paid"),
        ("event:!!notb64!!:x", "signal", "event:!!notb64!!:x"),
        ("event:", "signal", ""),  # decodes to the empty name, like JS
        ("approve:r1", "signal", "approve:r1"),
    ],
)
def test_classify_waiter_token(token: str, on: str, name: str) -> None:
    assert classify_waiter_token(token) == RunWaiting(on=on, name=name)  # type: ignore[arg-type]


def test_resolve_run_waiting_only_for_suspended_runs_with_a_waiter() -> None:
    waiters = [SignalWaiter("sig-b", "r1", 5), SignalWaiter("sig-a", "r1", 2)]
    index = index_waiters_by_run(waiters)
    assert index["r1"].token == "sig-b"  # first in the given order wins
    assert resolve_run_waiting(make_run("r1", status="suspended"), index) == RunWaiting(
        "signal", "sig-b"
    )
    assert resolve_run_waiting(make_run("r1", status="running"), index) is None
    assert resolve_run_waiting(make_run("r2", status="suspended"), index) is None


def test_list_item_json() -> None:
    run = make_run("r1", status="suspended", output={"x": 1})
    item = RunListItem(run=run, waiting=RunWaiting("breakpoint", "breakpoint"))
    data = item.to_json()
    assert data["waiting"] == {"on": "breakpoint", "name": "breakpoint"}
    assert data["id"] == "r1" and data["output"] == {"x": 1}
    row = item.to_row_json()
    assert "input" not in row and "output" not in row and row["waiting"]["on"] == "breakpoint"
    assert RunListItem.from_json(data) == item
    assert "waiting" not in RunListItem(run=run).to_json()


async def _parked(store: InMemoryStateStore) -> None:
    specs = [
        ("bp", "suspended", "bp:bp:3"),
        ("sig", "suspended", "approve"),
        ("hook", "suspended", "wh:tok"),
        ("run", "running", "lingering"),
        ("gone", "cancelled", "orphan"),
        ("sleep", "suspended", None),
    ]
    for i, (run_id, status, token) in enumerate(specs):
        await store.create_run(make_run(run_id, status=status, created_at=at(i)))
        if token is not None:
            await store.put_signal_waiter(SignalWaiter(token, run_id, 1))


async def test_list_run_items_stamp_waiting_with_one_waiter_read() -> None:
    store = InMemoryStateStore()
    await _parked(store)
    before = store.statement_count
    items = await list_run_items(store, RunQuery())
    # list_runs + ONE list_signal_waiters + ONE heartbeat read (a suspended run is left
    # without a wait: is it on a remote step no worker consumes? No row reports a
    # transport, so no step row is read).
    assert store.statement_count - before == 3
    waiting = {i.run.id: i.waiting for i in items}
    assert waiting == {
        "bp": RunWaiting("breakpoint", "breakpoint"),
        "sig": RunWaiting("signal", "approve"),
        "hook": RunWaiting("webhook", "wh:tok"),
        "run": None,
        "gone": None,
        "sleep": None,
    }
    before = store.statement_count
    assert [i.waiting for i in await list_run_items(store, RunQuery(status="running"))] == [None]
    assert store.statement_count - before == 1  # nothing suspended: no waiter read


async def test_waiting_for() -> None:
    store = InMemoryStateStore()
    await _parked(store)
    got = await waiting_for(store, ["bp", "sig", "hook", "run", "gone", "sleep", "unknown"])
    assert got == {
        "bp": RunWaiting("breakpoint", "breakpoint"),
        "sig": RunWaiting("signal", "approve"),
        "hook": RunWaiting("webhook", "wh:tok"),
    }
    before = store.statement_count
    assert await waiting_for(store, []) == {}
    assert store.statement_count == before


# ------------------------------------------------------------------ queries


def test_as_run_query_and_facet_query() -> None:
    q = as_run_query(
        {"status": "running", "attributes": [{"key": "tier", "op": "in", "values": ["a"]}]},
        limit=5,
        tags=["etl"],
    )
    assert q.status == "running" and q.limit == 5 and q.tags == ("etl",)
    assert q.attributes == (AttributeFilter("tier", "in", values=("a",)),)
    assert q.origin is UNSET
    assert as_run_query(origin=None).origin is None
    with pytest.raises(TypeError):
        as_run_query(bogus=1)
    f = facet_query(RunQuery(status="x", statuses=["y"], origin=None, origins=[None], limit=1))  # type: ignore[list-item,arg-type]
    assert (f.status, f.statuses, f.origin, f.origins, f.limit) == (None, None, UNSET, None, None)


# ------------------------------------------------------------------ facets


def test_facet_origin_and_merge() -> None:
    assert facet_origin(None) is None and facet_origin("") is None and facet_origin("  ") is None
    assert facet_origin(" pkg ") == " pkg "
    assert merge_run_facet_rows([]) == []
    merged = merge_run_facet_rows(
        [("done", None, 1), ("done", "", 2), ("done", "   ", 3), ("done", "a", 1), ("x", "a", 0)]
    )
    assert merged == [RunFacetRow("done", None, 6), RunFacetRow("done", "a", 1)]  # type: ignore[arg-type]
    assert RunFacetRow("done", None, 6).to_json() == {  # type: ignore[arg-type]
        "status": "done",
        "origin": None,
        "count": 6,
    }


async def _three(store: InMemoryStateStore) -> None:
    await store.create_run(make_run("a", namespace="acme", origin="pkg", tags=("etl",)))
    await store.create_run(make_run("b", namespace="acme", origin="", tags=("etl", "x")))
    await store.create_run(make_run("c", namespace="globex", status="failed"))


async def test_run_facets_and_counts_are_whole_set() -> None:
    store = InMemoryStateStore()
    await _three(store)
    q = RunQuery(namespace="acme", status="failed", limit=1, offset=5)
    got = await run_facets(store, q)
    assert got == [RunFacetRow("running", None, 1), RunFacetRow("running", "pkg", 1)]
    assert await count_runs(store, RunQuery(namespace="acme", limit=1)) == 2


# ------------------------------------------------------------------ value facets


def test_js_string() -> None:
    cases = [(True, "true"), (False, "false"), (200, "200"), (200.0, "200"), (1.5, "1.5")]
    cases += [("s", "s"), (1e21, "1e+21"), (1e-7, "1e-7"), (0.00001, "0.00001"), (-0.0, "0")]
    for value, text in cases:
        assert js_string(value) == text, value


def test_merge_run_value_facet_rows_orders_and_limits() -> None:
    rows = [("b", 1), ("a", 1), (None, 1), ("c", 2), ("a", 0), ("z", -1)]
    assert merge_run_value_facet_rows(rows) == [
        RunValueFacetRow("c", 2),
        RunValueFacetRow("a", 1),
        RunValueFacetRow("b", 1),
        RunValueFacetRow(None, 1),
    ]
    assert merge_run_value_facet_rows(rows, {"limit": 2}) == [
        RunValueFacetRow("c", 2),
        RunValueFacetRow("a", 1),
    ]
    many = [(f"v{i:03d}", 1) for i in range(150)]
    assert len(merge_run_value_facet_rows(many)) == 100


def test_axes() -> None:
    assert axis_is_run_column("namespace") and axis_is_run_column({"field": "workflow"})
    assert not axis_is_run_column(RunValueAxis("tag"))
    with pytest.raises(ValueError):
        RunValueAxis("attributeValue")
    with pytest.raises(ValueError):
        RunValueAxis("bogus")  # type: ignore[arg-type]
    axis = RunValueAxis("attributeValue", key="tier")
    assert RunValueAxis.from_json(axis.to_json()) == axis
    assert RunValueFacetOptions.of({"limit": 3}).effective_scan == 5000


def test_run_value_facets_from_runs() -> None:
    runs = [
        make_run("a", search_attributes={"tier": "pro", "n": 2.0}, tags=("t", "t")),
        make_run("b", search_attributes={"tier": "free"}, tags=("t",)),
        make_run("c", origin="  "),
    ]
    assert run_value_facets_from_runs(runs, "tag") == [RunValueFacetRow("t", 2)]
    assert run_value_facets_from_runs(runs, {"field": "attributeValue", "key": "n"}) == [
        RunValueFacetRow("2", 1)
    ]
    assert run_value_facets_from_runs(runs, "origin") == [RunValueFacetRow(None, 3)]


async def test_run_value_facets_are_re_merged_under_the_limit() -> None:
    store = InMemoryStateStore()
    await _three(store)
    got = await run_value_facets(store, "tag", RunQuery(namespace="acme", limit=1), {"limit": 1})
    assert got == [RunValueFacetRow("etl", 2)]
    assert await run_value_facets(store, "tag", RunQuery()) == [
        RunValueFacetRow("etl", 2),
        RunValueFacetRow("x", 1),
    ]


# ------------------------------------------------------------------ worker health


async def test_worker_health_from_leases() -> None:
    store = InMemoryStateStore()
    for i, status in enumerate(["pending", "running", "running", "completed"]):
        await store.create_run(make_run(f"a{i}", namespace="acme", status=status))
    await store.create_run(make_run("g0", namespace="globex", status="pending"))
    assert await try_lock(store, "a1", "other", 10_800, 10_000)
    assert await try_lock(store, "a2", "stale", 9_000, 8_000)  # expired
    me_local = LocalWorker("me", limit=8, in_flight=1)
    got = await worker_health(store, now_ms=10_000, lease_ms=1000, namespace="acme", local=me_local)
    assert [g.group for g in got] == ["runs@acme"]
    acme = got[0]
    assert acme.depth == 3 and acme.kind == "workflow" and not acme.alert
    assert [(w.instance_id, w.last_beat_at) for w in acme.live_workers] == [
        ("me", 10_000),
        ("other", 9_800),
    ]
    me = acme.live_workers[0].to_json()
    assert me["status"] == {
        "runtime": "python",
        "concurrency": {"mode": "fixed", "limit": 8},
        "inFlight": 1,
    }
    # unscoped, over the bare store: every namespace; a backlog nobody works alerts
    everywhere = await worker_health(store, now_ms=10_000, lease_ms=1000)
    assert [(g.group, g.depth, len(g.live_workers)) for g in everywhere] == [
        ("runs@acme", 3, 1),
        ("runs@globex", 1, 0),
    ]
    assert everywhere[1].alert
    assert GroupHealth.from_json(acme.to_json()) == acme
    # an engine that does not drive runs is not listed, and its idle namespace is no group
    watcher = await worker_health(store, now_ms=10_000, lease_ms=1000, namespace="quiet")
    assert watcher == []
