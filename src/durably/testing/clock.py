"""`TestClock`: the time an environment's engine reads, moved only by the test or by the
time skipper.

The engine takes its clock as a function returning epoch milliseconds (`Engine(clock=...)`);
`TestClock.now` is that function. The clock starts at the real time of its creation (so run
timestamps look like today's) unless given a start, and never goes backwards: a deadline a
run has recorded stays reached once it is reached.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from durably._core.durations import Duration, to_ms

__all__ = ["Instant", "TestClock"]

Instant = datetime | int
"""An aware `datetime`, or epoch milliseconds."""


def _instant_ms(instant: Instant) -> int:
    if isinstance(instant, datetime):
        if instant.tzinfo is None:
            raise ValueError(f"{instant!r} is a naive datetime: give it a timezone (UTC)")
        return round(instant.timestamp() * 1000)
    if isinstance(instant, bool) or not isinstance(instant, int):
        raise TypeError(f"an instant is an aware datetime or epoch milliseconds, not {instant!r}")
    return instant


class TestClock:
    """Epoch milliseconds that move only when told to.

    `now()` reads it; `advance(duration)` moves it forward (seconds, a `timedelta` or a
    string such as `"5m"`, as every duration of durably's API); `set(instant)` moves it to
    an aware `datetime` or epoch milliseconds. Moving backwards raises `ValueError`.
    """

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, start: Instant | None = None):
        self._now = int(time.time() * 1000) if start is None else _instant_ms(start)
        self._moved: list[Callable[[], None]] = []

    def now(self) -> int:
        """The current time, epoch milliseconds."""
        return self._now

    def now_utc(self) -> datetime:
        """The current time as an aware UTC `datetime`."""
        return datetime.fromtimestamp(self._now / 1000.0, tz=UTC)

    def advance(self, duration: Duration) -> int:
        """Move forward by `duration`; returns the new time (epoch ms)."""
        ms = to_ms(duration)
        if ms < 0:
            raise ValueError(f"advance({duration!r}): the clock never goes backwards")
        return self._move(self._now + ms)

    def set(self, instant: Instant) -> int:
        """Move to `instant` (an aware datetime or epoch ms); returns it (epoch ms)."""
        ms = _instant_ms(instant)
        if ms < self._now:
            moved = timedelta(milliseconds=self._now - ms)
            raise ValueError(f"set({instant!r}) is {moved} in the past: the clock never goes back")
        return self._move(ms)

    def on_move(self, listener: Callable[[], None]) -> None:
        """Call `listener()` after every move (the environment nudges its engine)."""
        self._moved.append(listener)

    def _move(self, ms: int) -> int:
        changed = ms != self._now
        self._now = ms
        if changed:
            for listener in self._moved:
                listener()
        return ms
