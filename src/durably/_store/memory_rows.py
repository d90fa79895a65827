"""Row copies of the in-memory reference store: what it stores and what it hands back.

A leaf module (it imports nothing of the store), shared by `InMemoryStateStore` and its
parts (aggregates, signal buffer): parity with the SQL stores is decided here once.

- payloads (`input`, `output`, `error.details`, event data) must be strict JSON (no
  NaN/Infinity) and are stored as their JSON round trip (`to_json`), raising
  `SerializationError` otherwise, before anything is written;
- datetimes are stored at millisecond precision in UTC (`at_ms`);
- `namespace=None` is written as `'default'`;
- every read returns a fresh copy (`read_run`, `read_checkpoint`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from durably._core import jsonutil
from durably._core.models import (
    AttributeValue,
    JSONValue,
    StepCheckpoint,
    StepError,
    StepEvent,
    WorkflowRun,
    ms_from_utc,
    utc_from_ms,
)
from durably._store.query import DEFAULT_NAMESPACE, normalize_attribute_rows


def to_json(value: JSONValue) -> JSONValue:
    """Validate strict JSON and return its round trip (what a SQL store would read back)."""
    if value is None or isinstance(value, str | bool | int):
        return value
    return jsonutil.loads(jsonutil.dumps(value))


def clone(value: JSONValue) -> JSONValue:
    """Deep copy of a JSON value (dicts and lists only; scalars are immutable)."""
    if isinstance(value, dict):
        return {k: clone(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clone(v) for v in value]
    return value


def at_ms(value: datetime) -> datetime:
    return utc_from_ms(ms_from_utc(value))


def _norm_error(error: StepError | Mapping[str, Any] | None) -> StepError | None:
    if error is None:
        return None
    if isinstance(error, Mapping):
        error = StepError.from_json(error)
    if error.details is None:
        return error
    return dataclasses.replace(error, details=to_json(error.details))


def _read_error(error: StepError | None) -> StepError | None:
    if error is None or not isinstance(error.details, dict | list):
        return error
    return dataclasses.replace(error, details=clone(error.details))


def _norm_events(events: Iterable[StepEvent] | None) -> tuple[StepEvent, ...] | None:
    if not events:
        return None  # an empty list reads back absent, as from a SQL row
    out: list[StepEvent] = []
    for event in events:
        if isinstance(event, Mapping):
            event = StepEvent.from_json(event)
        if event.data is not None:
            event = dataclasses.replace(event, data=to_json(event.data))
        out.append(event)
    return tuple(out)


def _read_events(events: tuple[StepEvent, ...] | None) -> tuple[StepEvent, ...] | None:
    if events is None:
        return None
    return tuple(
        dataclasses.replace(e, data=clone(e.data)) if isinstance(e.data, dict | list) else e
        for e in events
    )


def _norm_attributes(
    run_id: str, attrs: Mapping[str, AttributeValue] | None
) -> dict[str, AttributeValue] | None:
    if attrs is None:
        return None
    normalize_attribute_rows(run_id, attrs)  # validates: flat str/int/float/bool values only
    jsonutil.dumps(dict(attrs))  # rejects NaN/Infinity like a SQL store would
    return dict(attrs)


def norm_run(run: WorkflowRun) -> WorkflowRun:
    return dataclasses.replace(
        run,
        input=to_json(run.input),
        output=to_json(run.output),
        error=_norm_error(run.error),
        tags=tuple(run.tags) if run.tags is not None else None,
        search_attributes=_norm_attributes(run.id, run.search_attributes),
        namespace=DEFAULT_NAMESPACE if run.namespace is None else run.namespace,
        created_at=at_ms(run.created_at),
        updated_at=at_ms(run.updated_at),
    )


def read_run(run: WorkflowRun) -> WorkflowRun:
    return dataclasses.replace(
        run,
        input=clone(run.input),
        output=clone(run.output),
        error=_read_error(run.error),
        search_attributes=(
            dict(run.search_attributes) if run.search_attributes is not None else None
        ),
    )


def norm_checkpoint(cp: StepCheckpoint) -> StepCheckpoint:
    started = at_ms(cp.started_at)
    return dataclasses.replace(
        cp,
        input=to_json(cp.input),
        output=to_json(cp.output),
        error=_norm_error(cp.error),
        events=_norm_events(cp.events),
        attempt_errors=cp.attempt_errors or None,  # immutable entries: no copy needed
        started_at=started,
        finished_at=at_ms(cp.finished_at),
        # `enqueuedAt` absent is written as `startedAt` (a step that was never queued).
        enqueued_at=at_ms(cp.enqueued_at) if cp.enqueued_at is not None else started,
    )


def read_checkpoint(cp: StepCheckpoint) -> StepCheckpoint:
    if (
        not isinstance(cp.input, dict | list)
        and not isinstance(cp.output, dict | list)
        and cp.error is None
        and cp.events is None
    ):
        return cp  # nothing mutable inside: the frozen row is its own copy
    return dataclasses.replace(
        cp,
        input=clone(cp.input),
        output=clone(cp.output),
        error=_read_error(cp.error),
        events=_read_events(cp.events),
    )


def norm_patch_value(run_id: str, key: str, value: Any) -> Any:
    if key in ("input", "output"):
        return to_json(value)
    if key == "error":
        return _norm_error(value)
    if key == "tags":
        return tuple(value) if value is not None else None
    if key == "search_attributes":
        return _norm_attributes(run_id, value)
    if key == "namespace":
        return DEFAULT_NAMESPACE if value is None else value
    if key in ("created_at", "updated_at"):
        return at_ms(value)
    return value


__all__ = [
    "at_ms",
    "clone",
    "norm_checkpoint",
    "norm_patch_value",
    "norm_run",
    "read_checkpoint",
    "read_run",
    "to_json",
]
