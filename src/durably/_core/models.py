"""Persisted and wire data objects (store.md §1, engine.md §1.1, §2.1, §4.1).

Every object is an immutable slotted dataclass with snake_case attributes. Its JSON form
(`to_json()` / `from_json()`) uses the upstream camelCase keys (api.md naming rule). Stores
and the engine produce changed copies with `dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, TypedDict, TypeGuard, TypeVar

_T = TypeVar("_T")

JSONValue = Any
"""Any JSON-compatible value (dict/list/str/int/float/bool/None)."""

RunStatus = Literal[
    "pending",
    "running",
    "suspended",
    "cancelling",
    "blocked",
    "completed",
    "failed",
    "cancelled",
    "dead",
]
CheckpointStatus = Literal["pending", "running", "completed", "failed"]
CheckpointKind = Literal["local", "remote", "sleep", "signal"]

# engine.md §1.2
TERMINAL_RUN_STATUSES: tuple[RunStatus, ...] = ("completed", "failed", "cancelled", "dead")
DEFAULT_CONCURRENCY_STATUSES: tuple[RunStatus, ...] = (
    "pending",
    "running",
    "suspended",
    "cancelling",
    "blocked",
)
# Not terminal: a turn may still write over these (durably's conditional settle writes).
LIVE_RUN_STATUSES: tuple[RunStatus, ...] = DEFAULT_CONCURRENCY_STATUSES
RUN_STATUSES: tuple[RunStatus, ...] = (
    "pending",
    "running",
    "suspended",
    "cancelling",
    "blocked",
    "completed",
    "failed",
    "cancelled",
    "dead",
)

# engine.md §2.2: onError handoff checkpoints live at seq >= this base.
HANDOFF_SEQ_BASE = 1_000_000_000
# store.md §1.5
CHILD_EDGE_PREFIXES: tuple[str, ...] = ("signal:child:", "fan:", "spawn:")


def utc_from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)


def ms_from_utc(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return round(value.timestamp() * 1000)


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _parse_dt(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        return utc_from_ms(int(value))
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    # store.md §0 / engine.md §4.1: absent keys are omitted, not written as null.
    return {k: v for k, v in data.items() if v is not None}


@dataclass(frozen=True, slots=True)
class StepError:
    """A recorded failure (engine.md §4.1). `details` is any JSON value."""

    message: str
    code: str | None = None
    details: JSONValue = None
    retryable: bool | None = None
    stack: str | None = None

    def to_json(self) -> dict[str, Any]:
        return _drop_none(
            {
                "message": self.message,
                "code": self.code,
                "details": self.details,
                "retryable": self.retryable,
                "stack": self.stack,
            }
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepError:
        code = data.get("code")
        retryable = data.get("retryable")
        return cls(
            message=str(data.get("message", "")),
            # compat-notes A.2: a `code: null` from a worker means "no code".
            code=code if isinstance(code, str) else None,
            details=data.get("details"),
            retryable=retryable if isinstance(retryable, bool) else None,
            stack=data.get("stack") if isinstance(data.get("stack"), str) else None,
        )


@dataclass(frozen=True, slots=True)
class StepEvent:
    """One log line or sub-process outcome of a step attempt (engine.md §3.15)."""

    at: int
    level: str
    message: str
    sub_id: str | None = None
    name: str | None = None
    group: str | None = None
    status: str | None = None
    phase: str | None = None
    data: JSONValue = None

    def to_json(self) -> dict[str, Any]:
        return _drop_none(
            {
                "at": self.at,
                "level": self.level,
                "message": self.message,
                "subId": self.sub_id,
                "name": self.name,
                "group": self.group,
                "status": self.status,
                "phase": self.phase,
                "data": self.data,
            }
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepEvent:
        return cls(
            at=int(data.get("at", 0)),
            level=str(data.get("level", "info")),
            message=str(data.get("message", "")),
            sub_id=data.get("subId"),
            name=data.get("name"),
            group=data.get("group"),
            status=data.get("status"),
            phase=data.get("phase"),
            data=data.get("data"),
        )


@dataclass(frozen=True, slots=True)
class WorkflowRun:
    """The persisted run row (store.md §1.2)."""

    id: str
    workflow: str
    workflow_version: str
    status: RunStatus
    created_at: datetime
    updated_at: datetime
    input: JSONValue = None
    output: JSONValue = None
    error: StepError | None = None
    wake_at: int | None = None
    locked_by: str | None = None
    locked_until: int | None = None
    recovery_attempts: int | None = None
    tags: tuple[str, ...] | None = None
    search_attributes: dict[str, str | int | float | bool] | None = None
    namespace: str | None = "default"
    origin: str | None = None
    priority: int | None = None
    awaiting_decision_task_id: str | None = None

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES

    def to_json(self) -> dict[str, Any]:
        return _drop_none(
            {
                "id": self.id,
                "workflow": self.workflow,
                "workflowVersion": self.workflow_version,
                "status": self.status,
                "input": self.input,
                "output": self.output,
                "error": self.error.to_json() if self.error else None,
                "wakeAt": self.wake_at,
                "lockedBy": self.locked_by,
                "lockedUntil": self.locked_until,
                "recoveryAttempts": self.recovery_attempts,
                "tags": list(self.tags) if self.tags is not None else None,
                "searchAttributes": self.search_attributes,
                "namespace": self.namespace,
                "origin": self.origin,
                "priority": self.priority,
                "awaitingDecisionTaskId": self.awaiting_decision_task_id,
                "createdAt": _iso(self.created_at),
                "updatedAt": _iso(self.updated_at),
            }
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkflowRun:
        err = data.get("error")
        tags = data.get("tags")
        created = _parse_dt(data.get("createdAt"))
        updated = _parse_dt(data.get("updatedAt"))
        assert created is not None and updated is not None
        return cls(
            id=str(data["id"]),
            workflow=str(data["workflow"]),
            workflow_version=str(data.get("workflowVersion", "1")),
            status=data["status"],
            input=data.get("input"),
            output=data.get("output"),
            error=StepError.from_json(err) if isinstance(err, Mapping) else None,
            wake_at=data.get("wakeAt"),
            locked_by=data.get("lockedBy"),
            locked_until=data.get("lockedUntil"),
            recovery_attempts=data.get("recoveryAttempts"),
            tags=tuple(tags) if tags is not None else None,
            search_attributes=data.get("searchAttributes"),
            namespace=data.get("namespace") or "default",
            origin=data.get("origin"),
            priority=data.get("priority"),
            awaiting_decision_task_id=data.get("awaitingDecisionTaskId"),
            created_at=created,
            updated_at=updated,
        )


class RunPatch(TypedDict, total=False):
    """A presence-based patch for `StateStore.update_run` (store.md §3.1).

    A key present with a value writes it; present with None clears the column (namespace
    None writes 'default'; created_at/updated_at are written only when not None); absent
    keys are left alone. Stores stamp `updated_at = now` when the patch does not carry it.
    """

    workflow: str
    workflow_version: str
    status: RunStatus
    input: JSONValue
    output: JSONValue
    error: StepError | None
    wake_at: int | None
    locked_by: str | None
    locked_until: int | None
    recovery_attempts: int | None
    tags: tuple[str, ...] | None
    search_attributes: dict[str, str | int | float | bool] | None
    namespace: str | None
    origin: str | None
    priority: int | None
    awaiting_decision_task_id: str | None
    created_at: datetime | None
    updated_at: datetime | None


@dataclass(frozen=True, slots=True)
class StepCheckpoint:
    """The persisted checkpoint row, key (run_id, seq) (store.md §1.3, engine.md §2.1)."""

    run_id: str
    seq: int
    name: str
    kind: CheckpointKind
    step_id: str
    status: CheckpointStatus
    started_at: datetime
    finished_at: datetime
    attempts: int = 1
    input: JSONValue = None
    output: JSONValue = None
    error: StepError | None = None
    worker_group: str | None = None
    events: tuple[StepEvent, ...] | None = None
    wake_at: int | None = None
    parallel_group: str | None = None
    enqueued_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return _drop_none(
            {
                "runId": self.run_id,
                "seq": self.seq,
                "name": self.name,
                "kind": self.kind,
                "stepId": self.step_id,
                "status": self.status,
                "input": self.input,
                "output": self.output,
                "error": self.error.to_json() if self.error else None,
                "attempts": self.attempts,
                "workerGroup": self.worker_group,
                "events": [e.to_json() for e in self.events] if self.events else None,
                "wakeAt": self.wake_at,
                "parallelGroup": self.parallel_group,
                "enqueuedAt": _iso(self.enqueued_at or self.started_at),
                "startedAt": _iso(self.started_at),
                "finishedAt": _iso(self.finished_at),
            }
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepCheckpoint:
        err = data.get("error")
        events = data.get("events")
        started = _parse_dt(data.get("startedAt"))
        finished = _parse_dt(data.get("finishedAt"))
        assert started is not None and finished is not None
        return cls(
            run_id=str(data["runId"]),
            seq=int(data["seq"]),
            name=str(data["name"]),
            kind=data["kind"],
            step_id=str(data.get("stepId") or f"{data['runId']}:{data['seq']}"),
            status=data["status"],
            input=data.get("input"),
            output=data.get("output"),
            error=StepError.from_json(err) if isinstance(err, Mapping) else None,
            attempts=int(data.get("attempts", 1)),
            worker_group=data.get("workerGroup"),
            events=tuple(StepEvent.from_json(e) for e in events) if events else None,
            wake_at=data.get("wakeAt"),
            parallel_group=data.get("parallelGroup"),
            enqueued_at=_parse_dt(data.get("enqueuedAt")) or started,
            started_at=started,
            finished_at=finished,
        )


@dataclass(frozen=True, slots=True)
class SignalWaiter:
    """A run waiting on a token (store.md §1.6). The token is the key."""

    token: str
    run_id: str
    seq: int
    parallel_group: str | None = None

    def to_json(self) -> dict[str, Any]:
        return _drop_none(
            {
                "token": self.token,
                "runId": self.run_id,
                "seq": self.seq,
                "parallelGroup": self.parallel_group,
            }
        )


@dataclass(frozen=True, slots=True)
class ChildWait:
    """One member of a fan registering its wait (store.md §3.6 `register_child_waits`,
    durably's shape): the waiter, and the `running` placeholder row to insert at its seq
    unless a row is already there."""

    waiter: SignalWaiter
    placeholder: StepCheckpoint | None = None


def delivered_signal(waiter: SignalWaiter, payload: JSONValue, at: datetime) -> StepCheckpoint:
    """engine.md §3.5: the instant `signal:<token>` checkpoint a delivery writes at the
    waiter's seq (its fan group copied, §2.5)."""
    return StepCheckpoint(
        run_id=waiter.run_id,
        seq=waiter.seq,
        name=f"signal:{waiter.token}",
        kind="signal",
        step_id=f"{waiter.run_id}:{waiter.seq}",
        status="completed",
        output=payload,
        parallel_group=waiter.parallel_group,
        attempts=1,
        enqueued_at=at,
        started_at=at,
        finished_at=at,
    )


@dataclass(frozen=True, slots=True)
class BufferedSignal:
    """A hit from `take_buffered_signal`: the payload may itself be None (store.md §3.7)."""

    payload: JSONValue


@dataclass(frozen=True, slots=True)
class BufferedEvent:
    """A published event kept until a waiter claims it (store.md §3.8)."""

    id: str
    name: str
    payload: JSONValue
    published_at: int


AttributeOp = Literal["eq", "ne", "gt", "gte", "lt", "lte", "in"]
AttributeValue = str | int | float | bool


@dataclass(frozen=True, slots=True)
class AttributeFilter:
    """One search-attribute predicate (store.md §7.2). `in` uses `values`."""

    key: str
    op: AttributeOp
    value: AttributeValue | None = None
    values: tuple[AttributeValue, ...] | None = None


class _Unset:
    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Any = _Unset()
"""Sentinel: `RunQuery.origin` absent (store.md §6). `None` means `origin IS NULL`."""


def is_set(value: object) -> TypeGuard[object]:
    return value is not UNSET


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Run list filters (store.md §6). Every field is optional; plurals OR within, all AND."""

    workflow: str | None = None
    workflows: Sequence[str] | None = None
    status: RunStatus | None = None
    statuses: Sequence[RunStatus] | None = None
    tag: str | None = None
    tags: Sequence[str] | None = None
    attributes: Sequence[AttributeFilter] | None = None
    namespace: str | None = None
    namespaces: Sequence[str] | None = None
    origin: Any = UNSET  # str, None (IS NULL) or UNSET (no restriction)
    origins: Sequence[str | None] | None = None
    limit: int | None = None
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class RunResult:
    """What most engine operations return (engine.md §1.1)."""

    run_id: str
    status: RunStatus
    output: JSONValue = None
    error: StepError | None = None

    def to_json(self) -> dict[str, Any]:
        return _drop_none(
            {
                "runId": self.run_id,
                "status": self.status,
                "output": self.output,
                "error": self.error.to_json() if self.error else None,
            }
        )


def checkpoint_name_kind(name: str) -> str:
    """store.md §13."""
    if name.startswith("signal:child:"):
        return "child"
    if name.startswith("fan:"):
        return "folded"
    if name.startswith("spawn:"):
        return "spawn"
    return "step"


def replace(obj: _T, **changes: Any) -> _T:
    """`dataclasses.replace` with a name that reads well at call sites."""
    return dataclasses.replace(obj, **changes)  # type: ignore[type-var]


def now_utc() -> datetime:
    return datetime.now(tz=UTC)


__all__ = [
    "CHILD_EDGE_PREFIXES",
    "DEFAULT_CONCURRENCY_STATUSES",
    "HANDOFF_SEQ_BASE",
    "LIVE_RUN_STATUSES",
    "RUN_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "UNSET",
    "AttributeFilter",
    "AttributeOp",
    "AttributeValue",
    "BufferedEvent",
    "BufferedSignal",
    "CheckpointKind",
    "CheckpointStatus",
    "JSONValue",
    "RunPatch",
    "RunQuery",
    "RunResult",
    "RunStatus",
    "SignalWaiter",
    "StepCheckpoint",
    "StepError",
    "StepEvent",
    "WorkflowRun",
    "checkpoint_name_kind",
    "ms_from_utc",
    "now_utc",
    "replace",
    "utc_from_ms",
]
