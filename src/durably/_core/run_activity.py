"""Runs over time: how many runs started, completed and failed in each time bucket.

The console's run list draws this as a chart. A store answers it with a bounded cost: the
window is at most `ACTIVITY_MAX_BUCKETS` buckets, the answer holds at most one row per
bucket, and the SQL stores count in the database (a `GROUP BY` over the indexed
`created_at` and `(status, updated_at)` columns) so no run row crosses the wire.

What the series mean, read from the run rows (no event history is kept for this):
- `started`: runs whose `created_at` falls in the bucket;
- `completed` / `failed`: runs now in that status whose `updated_at` — the moment their row
  last changed, which for a settled run is when it settled — falls in the bucket. A run
  retried after failing leaves the `failed` series: the chart shows where runs are now.

Types here sit below the store layer (a store never imports the read side); the in-memory
store answers with `run_activity_from_runs`, which the SQL stores must reproduce.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from durably._core.jsonshape import JsonObject
from durably._core.models import WorkflowRun, ms_from_utc

__all__ = [
    "ACTIVITY_MAX_BUCKETS",
    "ACTIVITY_MIN_BUCKET_MS",
    "ActivityBucket",
    "ActivityWindow",
    "merge_activity",
    "run_activity_from_runs",
]

#: A window holds at most this many buckets (the answer's size bound).
ACTIVITY_MAX_BUCKETS = 500
#: Buckets are at least one second wide.
ACTIVITY_MIN_BUCKET_MS = 1000


@dataclass(frozen=True, slots=True)
class ActivityWindow:
    """`buckets` consecutive buckets of `bucket_ms` milliseconds from `since_ms` (epoch ms).
    Checked on construction: a window the stores would not bound is refused here."""

    since_ms: int
    bucket_ms: int
    buckets: int

    def __post_init__(self) -> None:
        for name in ("since_ms", "bucket_ms", "buckets"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"ActivityWindow.{name} must be an int, got {value!r}")
        if self.since_ms < 0:
            raise ValueError(f"ActivityWindow.since_ms must not be negative, got {self.since_ms}")
        if self.bucket_ms < ACTIVITY_MIN_BUCKET_MS:
            raise ValueError(
                f"ActivityWindow.bucket_ms must be at least {ACTIVITY_MIN_BUCKET_MS}, "
                f"got {self.bucket_ms}"
            )
        if not 1 <= self.buckets <= ACTIVITY_MAX_BUCKETS:
            raise ValueError(
                f"ActivityWindow.buckets must be between 1 and {ACTIVITY_MAX_BUCKETS}, "
                f"got {self.buckets}"
            )

    @property
    def until_ms(self) -> int:
        """The end of the last bucket (exclusive)."""
        return self.since_ms + self.bucket_ms * self.buckets

    def index(self, at_ms: int) -> int | None:
        """The bucket `at_ms` falls in, or None outside the window."""
        if at_ms < self.since_ms or at_ms >= self.until_ms:
            return None
        return (at_ms - self.since_ms) // self.bucket_ms


@dataclass(frozen=True, slots=True)
class ActivityBucket(JsonObject):
    """One bucket that saw something: its start (epoch ms) and the three counts."""

    start_ms: int
    started: int = 0
    completed: int = 0
    failed: int = 0


def merge_activity(
    window: ActivityWindow,
    started: Iterable[tuple[int, int]],
    settled: Iterable[tuple[int, str, int]],
) -> list[ActivityBucket]:
    """Buckets from raw cells — `(index, count)` of starts, `(index, status, count)` of
    settled runs — ordered by time, empty buckets left out."""
    cells: dict[int, list[int]] = {}
    for index, count in started:
        cells.setdefault(int(index), [0, 0, 0])[0] += int(count)
    for index, status, count in settled:
        column = 1 if status == "completed" else 2
        cells.setdefault(int(index), [0, 0, 0])[column] += int(count)
    return [
        ActivityBucket(
            start_ms=window.since_ms + index * window.bucket_ms,
            started=counts[0],
            completed=counts[1],
            failed=counts[2],
        )
        for index, counts in sorted(cells.items())
        if 0 <= index < window.buckets and any(counts)
    ]


def run_activity_from_runs(
    runs: Iterable[WorkflowRun], window: ActivityWindow
) -> list[ActivityBucket]:
    """The in-memory reference answer over run rows (module docstring)."""
    started: list[tuple[int, int]] = []
    settled: list[tuple[int, str, int]] = []
    for run in runs:
        index = window.index(ms_from_utc(run.created_at))
        if index is not None:
            started.append((index, 1))
        if run.status in ("completed", "failed"):
            index = window.index(ms_from_utc(run.updated_at))
            if index is not None:
                settled.append((index, run.status, 1))
    return merge_activity(window, started, settled)
