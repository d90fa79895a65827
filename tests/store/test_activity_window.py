"""`ActivityWindow` refuses a window the stores would not bound, before any store is asked."""

from __future__ import annotations

from typing import Any

import pytest

from durably import ActivityWindow
from durably._core.run_activity import ACTIVITY_MAX_BUCKETS

MINUTE = 60_000


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


def test_a_window_places_instants_in_buckets() -> None:
    w = ActivityWindow(since_ms=1000, bucket_ms=1000, buckets=3)
    assert w.until_ms == 4000
    assert [w.index(t) for t in (999, 1000, 1999, 2000, 3999, 4000)] == [None, 0, 0, 1, 2, None]
