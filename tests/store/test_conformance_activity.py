"""Runs over time (`run_activity`) on every first-party store (memory, SQLite, PostgreSQL):
the same buckets from the same rows, filters applied, the window's edges exact, and the
SQL stores' answer one row per non-empty bucket."""

from __future__ import annotations

from typing import Any

import pytest

from durably import RunQuery
from durably._core.models import ms_from_utc
from durably._core.run_activity import ACTIVITY_MAX_BUCKETS, ActivityBucket, ActivityWindow
from durably._store.sql import SqlStateStore
from tests.store.support import T0, at, make_run

MINUTE = 60_000


def cells(rows: list[ActivityBucket]) -> list[tuple[int, int, int, int]]:
    return [(r.start_ms, r.started, r.completed, r.failed) for r in rows]


async def seed(store: Any) -> None:
    runs = [
        # minute 0: two starts, one of them completes in minute 1
        make_run("c1", status="completed", created_at=at(0), updated_at=at(1, ms=500)),
        make_run("r1", status="running", created_at=at(0, ms=59_999), updated_at=at(3)),
        # minute 2: a start that fails in minute 2, another workflow's start
        make_run("f1", status="failed", created_at=at(2), updated_at=at(2, ms=10)),
        make_run("o1", workflow="other", status="completed", created_at=at(2), updated_at=at(4)),
        # outside the window on both sides (the window is minutes 0..4)
        make_run("early", status="completed", created_at=at(-1), updated_at=at(-1)),
        make_run("late", status="failed", created_at=at(5), updated_at=at(5)),
        # cancelled runs count as started only
        make_run("x1", status="cancelled", created_at=at(3), updated_at=at(3)),
    ]
    for run in runs:
        await store.create_run(run)


def window(buckets: int = 5) -> ActivityWindow:
    return ActivityWindow(since_ms=ms_from_utc(T0), bucket_ms=MINUTE, buckets=buckets)


async def test_buckets_count_starts_and_settles(store: Any) -> None:
    await seed(store)
    base = ms_from_utc(T0)
    rows = await store.run_activity(RunQuery(), window())
    assert cells(rows) == [
        (base, 2, 0, 0),
        (base + MINUTE, 0, 1, 0),
        (base + 2 * MINUTE, 2, 0, 1),
        (base + 3 * MINUTE, 1, 0, 0),
        (base + 4 * MINUTE, 0, 1, 0),
    ]


async def test_filters_and_pages_apply_as_in_the_list(store: Any) -> None:
    await seed(store)
    base = ms_from_utc(T0)
    rows = await store.run_activity(RunQuery(workflow="other", limit=1, offset=5), window())
    assert cells(rows) == [(base + 2 * MINUTE, 1, 0, 0), (base + 4 * MINUTE, 0, 1, 0)]


async def test_the_window_end_is_exclusive(store: Any) -> None:
    await seed(store)
    base = ms_from_utc(T0)
    rows = await store.run_activity(RunQuery(), window(buckets=2))
    # minute 2 (f1, o1) is the first instant past a 2-bucket window
    assert cells(rows) == [(base, 2, 0, 0), (base + MINUTE, 0, 1, 0)]


async def test_an_empty_store_answers_no_buckets(store: Any) -> None:
    assert await store.run_activity(RunQuery(), window()) == []


async def test_sql_sends_back_one_row_per_bucket(store: Any) -> None:
    if not isinstance(store, SqlStateStore):
        pytest.skip("the read counter is the SQL stores' test hook")
    for i in range(200):
        await store.create_run(
            make_run(f"b{i}", status="completed", created_at=at(0, ms=i), updated_at=at(1))
        )
    before = store.facet_rows_read
    rows = await store.run_activity(RunQuery(), window())
    assert cells(rows) == [
        (ms_from_utc(T0), 200, 0, 0),
        (ms_from_utc(T0) + MINUTE, 0, 200, 0),
    ]
    assert store.facet_rows_read - before == 2  # one GROUP BY row per bucket, not 400 runs


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"since_ms": -1, "bucket_ms": MINUTE, "buckets": 1}, "since_ms"),
        ({"since_ms": 0, "bucket_ms": 10, "buckets": 1}, "bucket_ms"),
        ({"since_ms": 0, "bucket_ms": MINUTE, "buckets": 0}, "buckets"),
        ({"since_ms": 0, "bucket_ms": MINUTE, "buckets": ACTIVITY_MAX_BUCKETS + 1}, "buckets"),
        ({"since_ms": 0, "bucket_ms": True, "buckets": 1}, "bucket_ms"),
    ],
)
def test_a_window_the_stores_would_not_bound_is_refused(kwargs: dict[str, Any], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        ActivityWindow(**kwargs)


async def test_sql_plans_read_the_window_through_indexes(store: Any) -> None:
    """EXPLAIN of both statements: the window is a range on an index (`created_at` for the
    starts, `(status, updated_at)` for the settled runs), never a scan of every run."""
    if not isinstance(store, SqlStateStore):
        pytest.skip("query plans are the SQL stores'")
    from durably._store.sql.facets import run_activity_statements
    from tests.store.test_conformance_facets import _plan

    for i in range(50):
        await store.create_run(make_run(f"p{i}", status="completed", created_at=at(i)))
    started, settled = run_activity_statements(RunQuery(), window())
    started_plan = await _plan(store, started)
    assert "durable_workflow_runs_created_at_idx" in started_plan, started_plan
    settled_plan = await _plan(store, settled)
    assert "durable_workflow_runs_status_updated_at_idx" in settled_plan, settled_plan
