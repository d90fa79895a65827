"""Two paths, one answer: for generated timelines written into a real
store — in-memory, SQLite (file) and PostgreSQL (a fresh schema) — the store-aggregate path
(`summarize_run_from_store`, `page_fan_from_store`) returns exactly the `RunSummary` and
`FanPage` of the in-memory reference (`summarize_run_in_memory`, `page_fan`) over
`store.list_checkpoints(run)`. The gateway's `store_run_detail` / `store_fan_members` give the
same answer with an etag, and a matching `If-None-Match` reads no checkpoint row.

Hypothesis drives a synchronous test; each store lives on its own event loop for the whole
module (a schema per example would cost more than the example), and every example writes a
fresh run id.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytest.importorskip("hypothesis")

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from durably import InMemoryStateStore, StepCheckpoint, WorkflowRun
from durably._read.gateway import store_fan_members, store_run_detail
from durably._read.models import FanPageQuery, RunDetailOptions
from durably._read.store_path import page_fan_from_store, summarize_run_from_store
from durably._read.summarize import is_wide, page_fan, summarize_run_in_memory
from durably._read.vocabulary import FAN_SUMMARY_FAILURES, checkpoint_name_kind, weight
from tests.pg_support import fresh_schema, schema_url

from .builders import T0
from .strategies import fan_page_queries, groups_of, overs, timelines

T = TypeVar("T")

EXAMPLES = {"memory": 200, "sqlite": 80, "postgres": 80}


class Harness:
    """A store on a private event loop (hypothesis runs the test body synchronously)."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.loop = asyncio.new_event_loop()
        self._schema_cm: AbstractAsyncContextManager[str] | None = None
        self.store: Any = None
        self.tmp = tmp

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def open(self) -> None:
        if self.kind == "memory":
            self.store = InMemoryStateStore()
            return
        from durably._store.sql import SqlStateStore

        if self.kind == "sqlite":
            self.store = SqlStateStore.from_url(f"sqlite:///{self.tmp}/paths.db")
        else:
            self._schema_cm = fresh_schema(create=False)
            schema = self.run(self._schema_cm.__aenter__())
            self.store = SqlStateStore.from_url(schema_url(schema))
        self.run(self.store.ensure_schema())

    def close(self) -> None:
        try:
            if self.kind != "memory" and self.store is not None:
                self.run(self.store.close())
            if self._schema_cm is not None:
                self.run(self._schema_cm.__aexit__(None, None, None))
        finally:
            self.loop.close()


@pytest.fixture(scope="module", params=["memory", "sqlite", "postgres"])
def harness(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    h = Harness(request.param, tmp_path_factory.mktemp(f"paths-{request.param}"))
    try:
        h.open()
    except BaseException:
        h.loop.close()
        raise
    try:
        yield h
    finally:
        h.close()


async def _write(store: Any, rows: list[StepCheckpoint]) -> str:
    """The timeline under a fresh run id (names keep their generated ids)."""
    run_id = f"p-{uuid.uuid4().hex[:10]}"
    await store.create_run(
        WorkflowRun(
            id=run_id,
            workflow="w",
            workflow_version="1",
            status="running",
            created_at=T0,
            updated_at=T0,
        )
    )
    for cp in rows:
        await store.save_checkpoint(replace(cp, run_id=run_id, step_id=f"{run_id}:{cp.seq}"))
    return run_id


def _read_bound(rows: list[StepCheckpoint], over: int) -> int:
    """What the store path may read — the returned timeline, every folded row, per
    wide fan ≤ 20 failed rows plus its completed child rows, and the child-edge rows."""
    groups: dict[str, list[StepCheckpoint]] = {}
    for cp in rows:
        if cp.parallel_group is not None:
            groups.setdefault(cp.parallel_group, []).append(cp)
    wide = {g for g, ms in groups.items() if is_wide(g, sum(weight(m) for m in ms), over)}
    bound = sum(1 for cp in rows if cp.parallel_group not in wide)
    bound += sum(1 for cp in rows if checkpoint_name_kind(cp.name) == "folded")
    for g in wide:
        bound += FAN_SUMMARY_FAILURES
        bound += sum(
            1
            for cp in groups[g]
            if checkpoint_name_kind(cp.name) == "child" and cp.status == "completed"
        )
    bound += sum(1 for cp in rows if checkpoint_name_kind(cp.name) != "step")
    return bound


async def _check(
    store: Any, rows: list[StepCheckpoint], over: int, queries: list[tuple[int, FanPageQuery]]
) -> None:
    run_id = await _write(store, rows)
    stored = await store.list_checkpoints(run_id)
    assert len(stored) == len(rows)

    # summarised run (store path == in-memory path), field by field
    expected = summarize_run_in_memory(stored, over)
    before = store.checkpoint_rows_read
    got = await summarize_run_from_store(store, run_id, over)
    read = store.checkpoint_rows_read - before
    assert got.timeline == expected.timeline
    assert got.fans == expected.fans
    assert got.children == expected.children
    assert got.child_count == expected.child_count
    assert read <= _read_bound(stored, over)

    # the gateway: same answer plus an etag; the etag answers not-modified reading no rows
    detail = await store_run_detail(store, run_id, RunDetailOptions(summarize_fans_over=over))
    assert detail is not None and detail.etag is not None and not detail.not_modified
    assert (detail.timeline, detail.fans, detail.children, detail.child_count) == (
        expected.timeline,
        expected.fans,
        expected.children,
        expected.child_count,
    )
    before = store.checkpoint_rows_read
    again = await store_run_detail(
        store, run_id, {"summarizeFansOver": over, "ifNoneMatch": detail.etag}
    )
    assert store.checkpoint_rows_read == before
    assert again is not None and again.not_modified and again.etag == detail.etag
    assert again.timeline == () and again.children == () and again.fans is None

    # fan pages (store path == in-memory path) for every group and an unknown one
    groups = [*groups_of(stored), "all:999999"]
    for pick, query in queries:
        group = groups[pick % len(groups)]
        want = page_fan(stored, group, query)
        page = await page_fan_from_store(store, run_id, group, query)
        if page.not_modified:  # the query's ifNoneMatch was `*`
            assert query.if_none_match == "*" and page.items == () and page.total == 0
            page = await page_fan_from_store(
                store, run_id, group, replace(query, if_none_match=None)
            )
        assert (page.items, page.total) == (want.items, want.total)
        assert page.etag is not None
        via_gateway = await store_fan_members(store, run_id, group, query)
        assert via_gateway is not None and via_gateway.etag == page.etag
        before = store.checkpoint_rows_read
        cached = await store_fan_members(
            store, run_id, group, replace(query, if_none_match=page.etag)
        )
        assert store.checkpoint_rows_read == before
        assert cached is not None and cached.not_modified and cached.total == 0


@st.composite
def cases(draw: Any) -> tuple[list[StepCheckpoint], int, list[tuple[int, FanPageQuery]]]:
    rows = draw(timelines(max_blocks=8, max_fan=40))
    over = draw(overs())
    queries = draw(st.lists(st.tuples(st.integers(0, 50), fan_page_queries()), max_size=3))
    return rows, over, queries


def test_store_path_equals_the_in_memory_path(harness: Harness) -> None:
    @settings(
        max_examples=EXAMPLES[harness.kind],
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        database=None,
    )
    @given(cases())
    def check(case: tuple[list[StepCheckpoint], int, list[tuple[int, FanPageQuery]]]) -> None:
        rows, over, queries = case
        harness.run(_check(harness.store, rows, over, queries))

    check()


def test_unknown_run_is_none_on_both_gateway_verbs(harness: Harness) -> None:
    assert harness.run(store_run_detail(harness.store, "nope", {"summarizeFansOver": 5})) is None
    assert harness.run(store_fan_members(harness.store, "nope", "all:0")) is None
