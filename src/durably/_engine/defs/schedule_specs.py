"""A `Schedule` as a persisted record, and back; when a persisted record is next due.

The spec keeps what `durably.Schedule` was given, with every duration as whole milliseconds
(the record must read the same in every process, whatever form the duration was written in).
Reading a record back rebuilds the `Schedule`, so a stored spec passes the same checks a
declaration does; a spec that does not (written by hand, or by another version) is a
`ValueError` naming the schedule, never a schedule that silently does something else.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from durably._core.schedules import ScheduleRecord, ScheduleSpec
from durably._engine.defs.schedules import Schedule

__all__ = ["initial_floor", "next_due", "schedule_from_record", "schedule_spec"]


def schedule_spec(schedule: Schedule) -> ScheduleSpec:
    """The stored form of a schedule's options (its id, workflow and `paused` are columns)."""
    return ScheduleSpec(
        input=schedule.input,
        every_ms=None if schedule.every is None else schedule.every_ms,
        cron=schedule.cron,
        timezone=schedule.timezone,
        overlap=schedule.overlap,
        jitter_ms=schedule.jitter_ms or None,
        max_catchup=schedule.max_catchup,
        tags=list(schedule.tags),
        search_attributes=(
            None if schedule.search_attributes is None else dict(schedule.search_attributes)
        ),
    )


def _ms(value: Any, what: str) -> timedelta | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be whole milliseconds, got {value!r}")
    return timedelta(milliseconds=value)


def schedule_from_record(record: ScheduleRecord) -> Schedule:
    """The `Schedule` a record describes; `ValueError` naming the schedule and what is wrong
    when its stored spec is not one a declaration would accept."""
    spec = record.spec
    try:
        tags = spec.get("tags") or []
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise ValueError(f"tags must be a list of strings, got {tags!r}")
        attributes = spec.get("search_attributes")
        if attributes is not None and not isinstance(attributes, dict):
            raise ValueError(f"search_attributes must be an object, got {attributes!r}")
        return Schedule(
            record.id,
            record.workflow,
            spec.get("input"),
            every=_ms(spec.get("every_ms"), "every_ms"),
            cron=spec.get("cron"),
            timezone=spec.get("timezone") or "UTC",
            overlap=spec.get("overlap") or "allow",  # type: ignore[arg-type]
            jitter=_ms(spec.get("jitter_ms"), "jitter_ms"),
            max_catchup=spec.get("max_catchup", 0),
            paused=record.paused,
            tags=tuple(tags),
            search_attributes=attributes,
        )
    except (TypeError, ValueError, NotImplementedError) as exc:
        message = str(exc)
        prefix = f'schedule "{record.id}"'
        if message.startswith(prefix):
            message = message[len(prefix) :].lstrip(": ")
        raise ValueError(f'stored schedule "{record.id}" cannot be read: {message}') from None


def initial_floor(schedule: Schedule, now_ms: int) -> int:
    """The window before the one `now_ms` is in: a schedule created (or resumed) at `now_ms`
    starts with the current window and never fires the windows it did not exist in (or was
    paused in), whatever its `max_catchup`."""
    current = schedule.window_start(now_ms)
    if current is None:
        return -1
    previous = schedule.previous_window(current)
    return -1 if previous is None else previous


def next_due(schedule: Schedule, now_ms: int, floor: int | None, held: int | None) -> int | None:
    """When a driving engine next has something to do for the record: at once while a window
    is held (its start waits for the live run to end); the current window's (jittered) start
    while it is not handled yet; else the next window's start. None when no window follows."""
    if schedule.paused:
        return None
    if held is not None:
        return now_ms
    current = schedule.window_start(now_ms)
    if current is not None and (floor is None or current > floor):
        return schedule.due_at(current)
    following = schedule.next_window(now_ms)
    return None if following is None else schedule.due_at(following)
