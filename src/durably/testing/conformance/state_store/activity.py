"""State-store cases: runs over time (`run_activity`)."""

from __future__ import annotations

from typing import Any

from durably import ActivityBucket, ActivityWindow, RunQuery
from durably._core.models import ms_from_utc

from .base import StoreCases
from .support import T0, at, make_run

MINUTE = 60_000


def cells(rows: list[ActivityBucket]) -> list[tuple[int, int, int, int]]:
    return [(r.start_ms, r.started, r.completed, r.failed) for r in rows]


def window(buckets: int = 5) -> ActivityWindow:
    """`buckets` minutes from `T0`."""
    return ActivityWindow(since_ms=ms_from_utc(T0), bucket_ms=MINUTE, buckets=buckets)


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
        # a cancelled run counts as started only
        make_run("x1", status="cancelled", created_at=at(3), updated_at=at(3)),
    ]
    for run in runs:
        await store.create_run(run)


class ActivityCases(StoreCases):
    """The runs-over-time cases of the state-store suite."""

    async def test_run_activity_counts_starts_and_settles_per_bucket(self, store: Any) -> None:
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

    async def test_run_activity_filters_like_the_list_and_ignores_the_page(
        self, store: Any
    ) -> None:
        await seed(store)
        base = ms_from_utc(T0)
        rows = await store.run_activity(RunQuery(workflow="other", limit=1, offset=5), window())
        assert cells(rows) == [(base + 2 * MINUTE, 1, 0, 0), (base + 4 * MINUTE, 0, 1, 0)]

    async def test_run_activity_window_end_is_exclusive(self, store: Any) -> None:
        await seed(store)
        base = ms_from_utc(T0)
        rows = await store.run_activity(RunQuery(), window(buckets=2))
        # minute 2 (f1, o1) is the first instant past a 2-bucket window
        assert cells(rows) == [(base, 2, 0, 0), (base + MINUTE, 0, 1, 0)]

    async def test_run_activity_of_an_empty_store_is_empty(self, store: Any) -> None:
        assert await store.run_activity(RunQuery(), window()) == []
