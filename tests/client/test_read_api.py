"""The Engine's read API end to end: run detail, fan pages and etags on a very wide fan.

A run with a 40,000-member step fan (`ctx.all_settled` over a trivial step, 4 members
failing) on the in-memory store, SQLite and PostgreSQL:
- `get_run_detail(summarize_fans_over=100)` reads at most 200 checkpoint rows (the stores'
  `checkpoint_rows_read` counters), its `to_json()` is under 64 KB, and the fan is ONE
  `FanSummary`;
- a repeat with the returned ETag answers not-modified and reads no checkpoint row;
- `get_fan_members` pages the members in seq order, `failed_only` finds the 4 failures, and
  a page's ETag answers not-modified without reading rows.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import durably
from durably import Engine, FatalError, WorkflowCtx
from tests.engine_support import EngineFactory
from tests.pg_support import fresh_schema

WIDE = 40_000
FAILING = {7, 10_007, 20_007, 39_999}
JSON_LIMIT = 64 * 1024


@pytest.fixture(params=["memory", "sqlite", "postgres"])
async def factory(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[EngineFactory]:
    if request.param != "postgres":
        yield EngineFactory(request.param, "hot", tmp_path)
        return
    async with fresh_schema(create=False) as schema:
        yield EngineFactory("postgres", "hot", tmp_path, pg_schema=schema)


def _counters(store: Any) -> tuple[int, int]:
    return store.checkpoint_rows_read, store.checkpoint_stats_rows_read


async def _wide_run(engine: Engine, uid: str) -> str:
    @durably.step(f"{uid}.work")
    def work(x: int) -> int:
        if x in FAILING:
            raise FatalError(f"member {x} failed", code="BAD")
        return x

    @durably.workflow(f"{uid}.wide")
    async def wide(ctx: WorkflowCtx, n: int) -> int:
        settled = await ctx.all_settled(work, range(n))
        return sum(1 for s in settled if s.status == "rejected")

    run_id = f"{uid}-wide"
    assert await engine.execute(wide, WIDE, run_id=run_id) == len(FAILING)
    return run_id


async def test_a_40000_member_fan_reads_a_bounded_detail(factory: EngineFactory, uid: str) -> None:
    async with factory() as engine:
        began = time.perf_counter()
        run_id = await _wide_run(engine, uid)
        built = time.perf_counter() - began
        store: Any = engine.store

        # -- the summarised detail: one GROUP BY plus a few rows
        rows0, buckets0 = _counters(store)
        began = time.perf_counter()
        detail = await engine.get_run_detail(run_id, summarize_fans_over=100)
        took = time.perf_counter() - began
        rows_read = store.checkpoint_rows_read - rows0
        buckets_read = store.checkpoint_stats_rows_read - buckets0
        assert detail is not None and detail.etag is not None and not detail.not_modified
        assert rows_read <= 200, rows_read
        size = len(json.dumps(detail.to_json()).encode())
        assert size < JSON_LIMIT, size

        assert detail.fans is not None and len(detail.fans) == 1
        fan = detail.fans[0]
        assert fan.label == f"{uid}.work"
        assert (fan.size, fan.total, fan.not_started, fan.fail_fast) == (WIDE, WIDE, 0, False)
        assert dict(fan.counts) == {"completed": WIDE - len(FAILING), "failed": len(FAILING)}
        assert len(fan.failures) == len(FAILING)
        assert all(cp.status == "failed" for cp in fan.failures)
        assert fan.finished_at is not None and fan.started_at is not None
        assert all(cp.parallel_group != fan.group for cp in detail.timeline)
        assert detail.children == () and detail.child_count == 0

        # -- the same detail again with its ETag: not modified, no checkpoint row read
        rows1 = store.checkpoint_rows_read
        cached = await engine.get_run_detail(
            run_id, summarize_fans_over=100, if_none_match=detail.etag
        )
        assert store.checkpoint_rows_read == rows1
        assert cached is not None and cached.not_modified and cached.etag == detail.etag
        assert cached.run.id == run_id and cached.timeline == () and cached.fans is None
        cached_size = len(json.dumps(cached.to_json()).encode())
        # another threshold is another answer (the threshold is an etag input)
        other = await engine.get_run_detail(
            run_id, summarize_fans_over=50, if_none_match=detail.etag
        )
        assert other is not None and not other.not_modified and other.etag != detail.etag

        # -- fan pages
        first = fan.first_seq
        rows2 = store.checkpoint_rows_read
        page = await engine.get_fan_members(run_id, fan.group, limit=100)
        page_rows = store.checkpoint_rows_read - rows2
        assert page is not None and page.total == WIDE and page_rows == 100
        assert [cp.seq for cp in page.items] == list(range(first, first + 100))
        tail = await engine.get_fan_members(run_id, fan.group, offset=WIDE - 30, limit=100)
        assert tail is not None and tail.total == WIDE
        assert [cp.seq for cp in tail.items] == list(range(first + WIDE - 30, first + WIDE))
        failed = await engine.get_fan_members(run_id, fan.group, failed_only=True)
        assert failed is not None and failed.total == len(FAILING)
        assert [cp.seq - first for cp in failed.items] == sorted(FAILING)
        assert failed.items == fan.failures
        rows3 = store.checkpoint_rows_read
        again = await engine.get_fan_members(run_id, fan.group, limit=100, if_none_match=page.etag)
        assert store.checkpoint_rows_read == rows3
        assert again is not None and again.not_modified and again.total == 0
        assert again.etag == page.etag
        unknown_group = await engine.get_fan_members(run_id, "all:123456")
        assert unknown_group is not None and (unknown_group.items, unknown_group.total) == ((), 0)

        # -- the unsummarised detail reads the whole timeline (and carries no etag)
        rows4 = store.checkpoint_rows_read
        full = await engine.get_run_detail(run_id, if_none_match=detail.etag)
        full_rows = store.checkpoint_rows_read - rows4
        assert full is not None and full.etag is None and not full.not_modified
        assert full.fans is None and len(full.timeline) >= WIDE and full_rows >= WIDE

    print(
        f"\n[{factory.store_kind}] built {WIDE} members in {built:.1f}s; summarised detail: "
        f"{rows_read} checkpoint rows + {buckets_read} stat buckets read, {size} B JSON, "
        f"{took * 1000:.0f} ms; ETag repeat: 0 rows, {cached_size} B; fan page of 100: "
        f"{page_rows} rows; unsummarised detail: {full_rows} rows"
    )


async def test_read_api_basics(factory: EngineFactory, uid: str) -> None:
    @durably.step(f"{uid}.s")
    def s(x: int) -> int:
        return x * 2

    @durably.workflow(f"{uid}.w")
    async def w(ctx: WorkflowCtx, n: int) -> int:
        values = await ctx.all(s, range(n))
        return sum(values)

    async with factory() as engine:
        assert await engine.execute(w, 5, run_id=f"{uid}-r") == 20
        assert await engine.get_run_detail("missing") is None
        assert await engine.get_run_detail("missing", summarize_fans_over=1) is None
        assert await engine.get_fan_members("missing", "all:0") is None

        # unsummarised: the full timeline, no etag, if_none_match ignored
        plain = await engine.get_run_detail(f"{uid}-r", if_none_match="*")
        assert plain is not None and len(plain.timeline) == 5
        assert plain.etag is None and plain.fans is None and not plain.not_modified

        # a fan of exactly `over` members stays in the timeline (unless declared wider:
        # `ctx.all` declares its size, all:<first>:5)
        at5 = await engine.get_run_detail(f"{uid}-r", summarize_fans_over=5)
        assert at5 is not None and at5.fans == () and len(at5.timeline) == 5
        at4 = await engine.get_run_detail(f"{uid}-r", summarize_fans_over=4)
        assert at4 is not None and at4.fans is not None and len(at4.fans) == 1
        assert at4.timeline == () and at4.fans[0].counts == {"completed": 5}
        star = await engine.get_run_detail(f"{uid}-r", summarize_fans_over=4, if_none_match="*")
        assert star is not None and star.not_modified

        # list_runs(**query) maps keyword filters onto RunQuery; get_run
        runs = await engine.list_runs(workflow=f"{uid}.w", statuses=["completed"])
        assert [r.id for r in runs] == [f"{uid}-r"]
        assert await engine.list_runs(workflow=f"{uid}.w", status="failed") == []
        got = await engine.get_run(f"{uid}-r")
        assert got is not None and got.status == "completed"
