"""Row mapping between the models and SQL rows.

Write: `None` → NULL; `namespace None` → `'default'`; `enqueued_at None` → `started_at`;
datetimes → epoch ms; JSON fields → strict JSON text (`jsonutil.dumps`: no NaN/Infinity,
raising `SerializationError` before anything is written).
Read: NULL → `None`; NULL namespace → `'default'`; NULL `enqueued_at` → `started_at`;
ms → aware UTC datetime; JSON text → value; integers normalised with `int()` (drivers may
hand back strings or Decimals for aggregates).

Rows are read positionally in the column order of `schema.RUN_COLUMNS` /
`schema.CHECKPOINT_COLUMNS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from durably._core import jsonutil
from durably._core.models import (
    AttemptError,
    BufferedEvent,
    SignalWaiter,
    StepCheckpoint,
    StepError,
    StepEvent,
    WorkflowRun,
    ms_from_utc,
    utc_from_ms,
)
from durably._store.query import DEFAULT_NAMESPACE, normalize_attribute_rows

_dumps = jsonutil.dumps
_loads = jsonutil.loads


# ------------------------------------------------------------------ scalar helpers


def json_or_null(value: Any) -> str | None:
    return None if value is None else _dumps(value)


def json_from_sql(text: str | None) -> Any:
    return _loads(text)


def error_to_sql(error: StepError | Mapping[str, Any] | None) -> str | None:
    if error is None:
        return None
    if isinstance(error, Mapping):
        error = StepError.from_json(error)
    return _dumps(error.to_json())


def error_from_sql(text: str | None) -> StepError | None:
    if text is None:
        return None
    data = _loads(text)
    return StepError.from_json(data) if isinstance(data, Mapping) else None


def events_to_sql(events: Iterable[StepEvent | Mapping[str, Any]] | None) -> str | None:
    if not events:
        return None  # an empty list is stored (and read back) as absent
    out = [
        StepEvent.from_json(e).to_json() if isinstance(e, Mapping) else e.to_json() for e in events
    ]
    return _dumps(out) if out else None


def events_from_sql(text: str | None) -> tuple[StepEvent, ...] | None:
    if text is None:
        return None
    data = _loads(text)
    if not data:
        return None
    return tuple(StepEvent.from_json(e) for e in data)


def attempt_errors_to_sql(cp: StepCheckpoint) -> str | None:
    """The attempt history column: `{"errors": [...], "omitted": n}`, NULL when empty."""
    if not cp.attempt_errors and not cp.attempt_errors_omitted:
        return None
    errors = [e.to_json() for e in cp.attempt_errors or ()]
    return _dumps({"errors": errors, "omitted": cp.attempt_errors_omitted})


def attempt_errors_from_sql(text: str | None) -> tuple[tuple[AttemptError, ...] | None, int]:
    if text is None:
        return None, 0
    data = _loads(text)
    if not isinstance(data, Mapping):
        return None, 0
    errors = tuple(
        AttemptError.from_json(e) for e in data.get("errors") or () if isinstance(e, Mapping)
    )
    omitted = data.get("omitted")
    count = int(omitted) if isinstance(omitted, int) and not isinstance(omitted, bool) else 0
    return errors or None, count


def tags_to_sql(tags: Sequence[str] | None) -> str | None:
    return None if tags is None else _dumps(list(tags))


def tags_from_sql(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(_loads(text))


def ms(value: datetime) -> int:
    return ms_from_utc(value)


def opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def tag_rows(run_id: str, tags: Sequence[str] | None) -> list[dict[str, Any]]:
    """`durable_run_tags` rows: set semantics, first occurrence order."""
    if not tags:
        return []
    return [{"run_id": run_id, "tag": tag} for tag in dict.fromkeys(tags)]


def attribute_rows(run_id: str, attrs: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """`durable_run_attributes` rows (validates the values)."""
    return [row._asdict() for row in normalize_attribute_rows(run_id, attrs)]


# ------------------------------------------------------------------ runs


def run_to_sql(run: WorkflowRun) -> dict[str, Any]:
    attrs = run.search_attributes
    if attrs is not None:
        normalize_attribute_rows(run.id, attrs)  # validate before writing the JSON column
    return {
        "id": run.id,
        "workflow": run.workflow,
        "workflow_version": run.workflow_version,
        "status": run.status,
        "input": json_or_null(run.input),
        "output": json_or_null(run.output),
        "error": error_to_sql(run.error),
        "wake_at": run.wake_at,
        "locked_by": run.locked_by,
        "locked_until": run.locked_until,
        "awaiting_decision_task_id": run.awaiting_decision_task_id,
        "recovery_attempts": run.recovery_attempts,
        "tags": tags_to_sql(run.tags),
        "search_attributes": json_or_null(dict(attrs) if attrs is not None else None),
        "priority": run.priority,
        "namespace": DEFAULT_NAMESPACE if run.namespace is None else run.namespace,
        "origin": run.origin,
        "created_at": ms(run.created_at),
        "updated_at": ms(run.updated_at),
    }


def run_from_row(row: Sequence[Any]) -> WorkflowRun:
    (
        id_,
        workflow,
        workflow_version,
        status,
        input_,
        output,
        error,
        wake_at,
        locked_by,
        locked_until,
        awaiting,
        recovery_attempts,
        tags,
        search_attributes,
        priority,
        namespace,
        origin,
        created_at,
        updated_at,
    ) = row
    return WorkflowRun(
        id=id_,
        workflow=workflow,
        workflow_version=workflow_version,
        status=status,
        created_at=utc_from_ms(int(created_at)),
        updated_at=utc_from_ms(int(updated_at)),
        input=_loads(input_),
        output=_loads(output),
        error=error_from_sql(error),
        wake_at=opt_int(wake_at),
        locked_by=locked_by,
        locked_until=opt_int(locked_until),
        recovery_attempts=opt_int(recovery_attempts),
        tags=tags_from_sql(tags),
        search_attributes=_loads(search_attributes),
        namespace=DEFAULT_NAMESPACE if namespace is None else namespace,
        origin=origin,
        priority=opt_int(priority),
        awaiting_decision_task_id=awaiting,
    )


def _patch_created_updated(value: datetime | None) -> int | None:
    return None if value is None else ms(value)


# RunPatch key -> converter to the SQL column value (the column has the key's name).
PATCH_CONVERTERS: dict[str, Any] = {
    "workflow": None,
    "workflow_version": None,
    "status": None,
    "input": json_or_null,
    "output": json_or_null,
    "error": error_to_sql,
    "wake_at": None,
    "locked_by": None,
    "locked_until": None,
    "recovery_attempts": None,
    "tags": tags_to_sql,
    "search_attributes": lambda v: json_or_null(dict(v) if v is not None else None),
    "namespace": lambda v: DEFAULT_NAMESPACE if v is None else v,
    "origin": None,
    "priority": None,
    "awaiting_decision_task_id": None,
    "created_at": _patch_created_updated,
    "updated_at": _patch_created_updated,
}


# ------------------------------------------------------------------ checkpoints


def checkpoint_to_sql(cp: StepCheckpoint) -> dict[str, Any]:
    started = ms(cp.started_at)
    return {
        "run_id": cp.run_id,
        "seq": cp.seq,
        "name": cp.name,
        "kind": cp.kind,
        "step_id": cp.step_id,
        "status": cp.status,
        "input": json_or_null(cp.input),
        "output": json_or_null(cp.output),
        "error": error_to_sql(cp.error),
        "events": events_to_sql(cp.events),
        "attempts": cp.attempts,
        "worker_group": cp.worker_group,
        "parallel_group": cp.parallel_group,
        "wake_at": cp.wake_at,
        "enqueued_at": started if cp.enqueued_at is None else ms(cp.enqueued_at),
        "started_at": started,
        "finished_at": ms(cp.finished_at),
        "attempt_errors": attempt_errors_to_sql(cp),
    }


def checkpoint_from_row(row: Sequence[Any]) -> StepCheckpoint:
    (
        run_id,
        seq,
        name,
        kind,
        step_id,
        status,
        input_,
        output,
        error,
        events,
        attempts,
        worker_group,
        parallel_group,
        wake_at,
        enqueued_at,
        started_at,
        finished_at,
        attempt_errors,
    ) = row
    started = utc_from_ms(int(started_at))
    kept, omitted = attempt_errors_from_sql(attempt_errors)
    return StepCheckpoint(
        run_id=run_id,
        seq=int(seq),
        name=name,
        kind=kind,
        step_id=step_id,
        status=status,
        started_at=started,
        finished_at=utc_from_ms(int(finished_at)),
        attempts=int(attempts),
        input=_loads(input_),
        output=_loads(output),
        error=error_from_sql(error),
        worker_group=worker_group,
        events=events_from_sql(events),
        wake_at=opt_int(wake_at),
        parallel_group=parallel_group,
        enqueued_at=started if enqueued_at is None else utc_from_ms(int(enqueued_at)),
        attempt_errors=kept,
        attempt_errors_omitted=omitted,
    )


# ------------------------------------------------------------------ waiters and buffers


def waiter_from_row(row: Sequence[Any]) -> SignalWaiter:
    token, run_id, seq, parallel_group = row
    return SignalWaiter(token=token, run_id=run_id, seq=int(seq), parallel_group=parallel_group)


def event_from_row(row: Sequence[Any]) -> BufferedEvent:
    id_, name, payload, published_at = row
    return BufferedEvent(id=id_, name=name, payload=_loads(payload), published_at=int(published_at))


__all__ = [
    "PATCH_CONVERTERS",
    "attribute_rows",
    "checkpoint_from_row",
    "checkpoint_to_sql",
    "error_to_sql",
    "event_from_row",
    "json_from_sql",
    "json_or_null",
    "run_from_row",
    "run_to_sql",
    "tag_rows",
    "waiter_from_row",
]
