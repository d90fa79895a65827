"""Persisted schedules as the store keeps them: `ScheduleRecord` and `ScheduleQuery`.

A record is a few queryable columns (id, workflow, namespace, paused, when it is next due,
when it was created and last written) and two JSON documents: `spec`, the schedule's options
(`ScheduleSpec`: what `durably.Schedule` was given, with durations as whole milliseconds), and
`state`, what firing it has done so far (`ScheduleState`). `updated_at` is also the record's
version: an engine advancing a record writes it only while `updated_at` is still the value it
read, so two engines racing on one record never both write their view of it.

The spec's `input` is a user payload: a store's codec encodes it at rest. Everything else in a
record stays readable (ids, cadence, counters, the last error), so the console and the CLI can
list schedules without the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

from durably._core.jsonutil import dumps, loads

__all__ = [
    "RECENT_RUNS_KEPT",
    "STATIC_STATE_PREFIX",
    "ScheduleQuery",
    "ScheduleRecord",
    "ScheduleSpec",
    "ScheduleState",
    "check_put",
    "check_query",
    "is_static_state",
    "record_from_row",
    "spec_json",
    "state_json",
    "static_state_id",
]

#: How many of its latest run ids a record's state keeps (newest first).
RECENT_RUNS_KEPT = 10

#: The id prefix of the records that keep the firing state of static schedules.
STATIC_STATE_PREFIX = "static:"


def static_state_id(schedule_id: str) -> str:
    """The id of the record holding a static schedule's firing state. A schedule id never
    holds ':', so this id can never be a persisted schedule's."""
    return f"{STATIC_STATE_PREFIX}{schedule_id}"


def is_static_state(record_id: str) -> bool:
    """Whether a record only keeps a static schedule's firing state (not a schedule to list,
    describe or fire as a persisted one)."""
    return record_id.startswith(STATIC_STATE_PREFIX)


class ScheduleSpec(TypedDict, total=False):
    """The options of a persisted schedule (a `durably.Schedule` without its id and its
    workflow, which are columns, and without `paused`, which is a column too)."""

    input: Any  # the user's payload: encoded at rest by a codec
    every_ms: int | None
    cron: str | None
    timezone: str
    overlap: str
    jitter_ms: int | None
    max_catchup: int
    tags: list[str]
    search_attributes: dict[str, str | int | float | bool] | None


class ScheduleState(TypedDict, total=False):
    """What firing a persisted schedule has done (all optional; an empty state: nothing yet).

    - `last_fire_at`: the clock's epoch ms when a run was last started for it;
      `last_run_id`: that run; `recent_runs`: its latest run ids, newest first
      (at most `RECENT_RUNS_KEPT`); `fired_count`: how many runs it started.
    - `last_window`: the latest window start (epoch ms) already decided — started, skipped or
      held: later ticks decide only windows after it, so no engine reconsiders a window
      another one decided. Set at creation and at unpause to the window before the current
      one, so a new or resumed schedule never starts the windows it did not exist (or was
      paused) in.
    - `held_window`: the window `overlap="buffer_one"` holds until the live run ends;
      `skipped_window`: the latest window `overlap="skip"` decided not to start.
    - `starting`: the run a tick decided to start and has not confirmed started yet (a start
      that failed, or an engine that stopped in between): the next tick starts it again
      (idempotently, by its id) while its window is still one a tick would fire.
    - `note`: the operator's note (given with pause); `last_error`: why the latest start
      failed (cleared by the next start that succeeds).
    """

    last_fire_at: int | None
    last_run_id: str | None
    recent_runs: list[str]
    fired_count: int
    last_window: int | None
    held_window: int | None
    skipped_window: int | None
    starting: str | None
    note: str | None
    last_error: str | None


@dataclass(frozen=True, slots=True)
class ScheduleRecord:
    """One persisted schedule (times in epoch ms). `next_fire_at` is when a driving engine
    next has something to do for it (None: nothing is due, e.g. while paused)."""

    id: str
    workflow: str
    namespace: str = "default"
    paused: bool = False
    next_fire_at: int | None = None
    created_at: int = 0
    updated_at: int = 0
    spec: ScheduleSpec = field(default_factory=lambda: ScheduleSpec())
    state: ScheduleState = field(default_factory=lambda: ScheduleState())


@dataclass(frozen=True, slots=True)
class ScheduleQuery:
    """Filters of `list_schedules` (None: no restriction). `due_before`: only records with a
    `next_fire_at` at or before it. Ordered by `next_fire_at` (records with none last), then
    id; `limit` and `offset` page that order."""

    workflow: str | None = None
    namespace: str | None = None
    paused: bool | None = None
    due_before: int | None = None
    limit: int = 100
    offset: int = 0


# ------------------------------------------------------------------ rows


def spec_json(record: ScheduleRecord) -> str:
    """The spec column's text (strict JSON: `SerializationError` for what JSON cannot hold)."""
    return dumps(dict(record.spec))


def state_json(record: ScheduleRecord) -> str:
    return dumps(dict(record.state))


def _document(text: str | bytes | None) -> dict[str, Any]:
    # A stored document is data anyone with store access can write: text that is not a JSON
    # object reads as an empty one, and rebuilding the schedule from it then says what is
    # wrong (the record is kept, never dropped).
    try:
        value = loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def record_from_row(
    schedule_id: str,
    workflow: str,
    namespace: str,
    paused: Any,
    next_fire_at: int | None,
    created_at: int,
    updated_at: int,
    spec: str | bytes | None,
    state: str | bytes | None,
) -> ScheduleRecord:
    """A record from its stored columns (the memory store keeps the same columns)."""
    return ScheduleRecord(
        id=schedule_id,
        workflow=workflow,
        namespace=namespace,
        paused=bool(paused),
        next_fire_at=None if next_fire_at is None else int(next_fire_at),
        created_at=int(created_at),
        updated_at=int(updated_at),
        spec=cast(ScheduleSpec, _document(spec)),
        state=cast(ScheduleState, _document(state)),
    )


def check_put(record: ScheduleRecord, if_absent: bool, expected_updated_at: int | None) -> None:
    """The arguments of `put_schedule`, checked the same way on every store."""
    if not isinstance(record, ScheduleRecord):
        raise TypeError(f"put_schedule takes a ScheduleRecord, got {record!r}")
    if if_absent and expected_updated_at is not None:
        raise ValueError(
            "put_schedule: if_absent= (insert only) and expected_updated_at= (replace only) "
            "cannot be combined"
        )


def check_query(query: ScheduleQuery) -> None:
    for name, value in (("limit", query.limit), ("offset", query.offset)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"ScheduleQuery.{name} must be a whole number >= 0, got {value!r}")
