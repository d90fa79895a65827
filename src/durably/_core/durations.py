"""Durations.

Internally the engine works in epoch milliseconds. Two parsers exist because the two
conventions differ on bare numbers: `parse_duration` reads a number as
MILLISECONDS (store/retention grammar), while the Python API reads a number as SECONDS
(asyncio's convention); `to_ms` implements the latter and is what user-facing calls use.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS_MS: dict[str, float] = {
    "ms": 1.0,
    "s": 1000.0,
    "sec": 1000.0,
    "second": 1000.0,
    "seconds": 1000.0,
    "m": 60_000.0,
    "min": 60_000.0,
    "minute": 60_000.0,
    "minutes": 60_000.0,
    "h": 3_600_000.0,
    "hr": 3_600_000.0,
    "hour": 3_600_000.0,
    "hours": 3_600_000.0,
    "d": 86_400_000.0,
    "day": 86_400_000.0,
    "days": 86_400_000.0,
    "w": 604_800_000.0,
    "week": 604_800_000.0,
    "weeks": 604_800_000.0,
}

_DURATION_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?|\.\d+)\s*([a-zA-Z]+)\s*$")

Duration = int | float | str | timedelta


def parse_duration(value: int | float | str) -> int:
    """A number is already ms; a string is `<number><unit>`."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration: {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"invalid duration: {value!r}")
        return round(value)
    match = _DURATION_RE.match(value)
    if not match:
        raise ValueError(f"invalid duration: {value!r}")
    number, unit = match.groups()
    factor = _UNITS_MS.get(unit.lower())
    if factor is None:
        raise ValueError(f"unknown duration unit: {unit!r} in {value!r}")
    return round(float(number) * factor)


def to_ms(value: Duration) -> int:
    """The Python API's rule: a number is SECONDS, a timedelta is itself, a string as
    `parse_duration`."""
    if isinstance(value, timedelta):
        return round(value.total_seconds() * 1000)
    if isinstance(value, bool):
        raise ValueError(f"invalid duration: {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"invalid duration: {value!r}")
        return round(value * 1000)
    return parse_duration(value)


def to_ms_or_none(value: Duration | None) -> int | None:
    return None if value is None else to_ms(value)


def ms_keyword(value: Duration) -> int:
    """A keyword whose name ends in `_ms` (`backoff_ms=`): a bare number is MILLISECONDS, as
    the name says — reading `backoff_ms=200` as 200 seconds would be a trap; a string or a
    timedelta is a duration as everywhere else."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration: {value!r}")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"invalid duration in milliseconds: {value!r}")
        return round(value)
    return to_ms(value)


def ms_keyword_or_none(value: Duration | None) -> int | None:
    return None if value is None else ms_keyword(value)
