"""`GET runs/activity`: runs started, completed and failed per time bucket, for the run
list's chart.

Parameters: `bucketMs` (the bucket width, 1 s to 31 days; default one hour), `buckets` (1 to
`ACTIVITY_MAX_BUCKETS`; default 48), `until` (epoch ms, the end of the window; default now,
rounded up to a whole bucket so the buckets stay put while time passes), and the run list's
filters (`workflow`, `namespace`, `tag`, `origin`, `unattributed`, `attr`). `status` is
refused: the chart's series are statuses. The answer is
`{sinceMs, untilMs, bucketMs, buckets, items: [{startMs, started, completed, failed}]}` —
empty buckets left out — counted in the store (`run_activity`), never from run rows sent
to the console.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from durably._core.run_activity import (
    ACTIVITY_MAX_BUCKETS,
    ACTIVITY_MIN_BUCKET_MS,
    ActivityBucket,
    ActivityWindow,
)
from durably.dashboard.filters import (
    FILTER_PARAMS,
    BadRequest,
    MultiParams,
    integer,
    run_query_kwargs,
)

__all__ = ["ACTIVITY_PARAMS", "ActivityReader", "activity_json", "window_of"]

#: A bucket at most 31 days wide.
MAX_BUCKET_MS = 31 * 24 * 3_600_000
DEFAULT_BUCKET_MS = 3_600_000
DEFAULT_BUCKETS = 48
#: Epoch milliseconds up to the year 9999.
_MAX_EPOCH_MS = 253_402_300_799_999
_DIGITS = re.compile(r"[0-9]{1,15}")  # ASCII digits only
ACTIVITY_PARAMS = (FILTER_PARAMS - {"status"}) | {"bucketMs", "buckets", "until"}


def _epoch_ms(params: MultiParams) -> int | None:
    values = params.getlist("until")
    if not values:
        return None
    text = values[0]
    if len(values) > 1 or not _DIGITS.fullmatch(text) or int(text) > _MAX_EPOCH_MS:
        raise BadRequest(
            f"Query parameter `until` must be given once, as epoch milliseconds from 0 to "
            f"{_MAX_EPOCH_MS}, got {', '.join(map(repr, values))}."
        )
    return int(text)


def window_of(params: MultiParams, now_ms: int) -> ActivityWindow:
    """The window a request asks for (module docstring); a window ending before the epoch's
    first bucket is a 400."""
    if params.getlist("status"):
        raise BadRequest(
            "Query parameter `status` is not read by runs/activity: its series are the "
            "statuses (started, completed, failed)."
        )
    width = integer(
        params,
        "bucketMs",
        default=DEFAULT_BUCKET_MS,
        low=ACTIVITY_MIN_BUCKET_MS,
        high=MAX_BUCKET_MS,
    )
    count = integer(params, "buckets", default=DEFAULT_BUCKETS, low=1, high=ACTIVITY_MAX_BUCKETS)
    until = _epoch_ms(params)
    if until is None:
        until = -(-now_ms // width) * width  # now, rounded up to a whole bucket
    since = until - width * count
    if since < 0:
        raise BadRequest(
            f"runs/activity: {count} buckets of {width} ms ending at {until} would start "
            "before 1970; ask for fewer buckets or a later `until`."
        )
    return ActivityWindow(since_ms=since, bucket_ms=width, buckets=count)


class ActivityReader(Protocol):
    """What the endpoint reads through: `Client.run_activity` / `Engine.run_activity`."""

    async def run_activity(self, window: ActivityWindow, **query: Any) -> list[ActivityBucket]: ...


async def activity_json(reader: ActivityReader, params: MultiParams, now_ms: int) -> dict[str, Any]:
    window = window_of(params, now_ms)
    items = await reader.run_activity(window, **run_query_kwargs(params))
    return {
        "sinceMs": window.since_ms,
        "untilMs": window.until_ms,
        "bucketMs": window.bucket_ms,
        "buckets": window.buckets,
        "items": [item.to_json() for item in items],
    }
