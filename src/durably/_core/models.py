"""Persisted and wire data objects: runs, checkpoints, errors, step events, signal waiters.

Every object is an immutable slotted dataclass with snake_case attributes. Its JSON form
(`to_json()` / `from_json()`, derived by `durably._core.jsonshape`) uses camelCase keys, omits
absent values and writes dates at full precision in UTC (`...07.891234Z`). Stores and the
engine produce changed copies with `dataclasses.replace`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypedDict, TypeGuard, TypeVar

from durably._core.jsonshape import JsonObject, json_field

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

# A terminal run never changes again; every other status is live.
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

# onError handoff checkpoints live at seq >= this base, clear of any workflow's own steps.
HANDOFF_SEQ_BASE = 1_000_000_000
# Checkpoint-name prefixes of the rows that stand for a child run (a child's completion,
# a folded fan, a spawned child).
CHILD_EDGE_PREFIXES: tuple[str, ...] = ("signal:child:", "fan:", "spawn:")


def utc_from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)


def ms_from_utc(value: datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return round(value.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class StepError(JsonObject):
    """A recorded failure. `details` is any JSON value.

    Reading, a `code` that is not a string (a worker's `code: null`) means "no code"."""

    message: str = field(metadata=json_field(read_default=""))
    code: str | None = None
    details: JSONValue = None
    retryable: bool | None = None
    stack: str | None = None


# The attempt history a step row keeps: the first and the last attempts' errors, and a count
# of those dropped between them, so a step retried a thousand times keeps a row of bounded
# size (its first failures say how it started, its last ones how it is going). A message is
# cut to a bounded length; the row's own `error` keeps the latest failure in full.
ATTEMPT_ERRORS_FIRST = 5
ATTEMPT_ERRORS_LAST = 20
ATTEMPT_MESSAGE_MAX = 2000


@dataclass(frozen=True, slots=True)
class AttemptError(JsonObject):
    """One failed attempt of a step: its number, when it failed (`at`, epoch ms), and its
    error's `message`, `code` and `retryable` flag (as the step's `StepError` had them)."""

    attempt: int = field(metadata=json_field(read_default=0))
    at: int = field(metadata=json_field(read_default=0))
    message: str = field(metadata=json_field(read_default=""))
    code: str | None = None
    retryable: bool | None = None


def add_attempt_error(
    kept: tuple[AttemptError, ...] | None,
    omitted: int,
    attempt: int,
    at: int,
    error: StepError,
) -> tuple[tuple[AttemptError, ...], int]:
    """The attempt history with one more failed attempt: (kept entries, number omitted).

    The first `ATTEMPT_ERRORS_FIRST` entries stay; past them only the last
    `ATTEMPT_ERRORS_LAST` are kept and each entry dropped from the middle is counted. Entries
    only append: after a requeue the numbers start again at 1 and the times tell the rounds
    apart."""
    message = error.message
    if len(message) > ATTEMPT_MESSAGE_MAX:
        message = message[: ATTEMPT_MESSAGE_MAX - 1] + "…"
    entry = AttemptError(
        attempt=attempt, at=at, message=message, code=error.code, retryable=error.retryable
    )
    entries = [*(kept or ()), entry]
    limit = ATTEMPT_ERRORS_FIRST + ATTEMPT_ERRORS_LAST
    if len(entries) > limit:
        drop = len(entries) - limit
        entries = entries[:ATTEMPT_ERRORS_FIRST] + entries[ATTEMPT_ERRORS_FIRST + drop :]
        omitted += drop
    return tuple(entries), omitted


@dataclass(frozen=True, slots=True)
class StepEvent(JsonObject):
    """One log line or sub-process outcome of a step attempt (`at` in epoch ms)."""

    at: int = field(metadata=json_field(read_default=0))
    level: str = field(metadata=json_field(read_default="info"))
    message: str = field(metadata=json_field(read_default=""))
    sub_id: str | None = None
    name: str | None = None
    group: str | None = None
    status: str | None = None
    phase: str | None = None
    data: JSONValue = None


def _default_namespace(_: Mapping[str, Any]) -> str:
    return "default"


@dataclass(frozen=True, slots=True)
class WorkflowRun(
    JsonObject,
    # The dates close the JSON form (stored and served in this order).
    order=(
        "id",
        "workflow",
        "workflow_version",
        "status",
        "input",
        "output",
        "error",
        "wake_at",
        "locked_by",
        "locked_until",
        "recovery_attempts",
        "tags",
        "search_attributes",
        "namespace",
        "origin",
        "priority",
        "awaiting_decision_task_id",
        "created_at",
        "updated_at",
    ),
):
    """The persisted run row.

    Reading, a missing `workflowVersion` is "1" and an empty or missing `namespace` is
    "default" (rows written before either existed)."""

    id: str
    workflow: str
    workflow_version: str = field(metadata=json_field(read_default="1"))
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
    namespace: str | None = field(
        default="default", metadata=json_field(read_fallback=_default_namespace)
    )
    origin: str | None = None
    priority: int | None = None
    awaiting_decision_task_id: str | None = None

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES


class RunPatch(TypedDict, total=False):
    """A presence-based patch for `StateStore.update_run`.

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


def _default_step_id(values: Mapping[str, Any]) -> str:
    return f"{values['run_id']}:{values['seq']}"


def _started_at_of(values: Mapping[str, Any]) -> Any:
    return values["started_at"]


def _started_at(cp: StepCheckpoint) -> datetime:
    return cp.started_at


@dataclass(frozen=True, slots=True)
class StepCheckpoint(
    JsonObject,
    # The payloads follow the identity, the dates close the JSON form.
    order=(
        "run_id",
        "seq",
        "name",
        "kind",
        "step_id",
        "status",
        "input",
        "output",
        "error",
        "attempts",
        "worker_group",
        "events",
        "wake_at",
        "parallel_group",
        "attempt_errors",
        "attempt_errors_omitted",
        "enqueued_at",
        "started_at",
        "finished_at",
    ),
):
    """The persisted checkpoint row, keyed by (run_id, seq).

    `attempt_errors` is the step's failed attempts, oldest first (bounded: the first
    `ATTEMPT_ERRORS_FIRST` and the last `ATTEMPT_ERRORS_LAST`, with
    `attempt_errors_omitted` counting those dropped between them); each attempt's write
    carries the history so far, so it costs no write of its own. Empty lists are omitted.

    In JSON, a checkpoint without its own `enqueued_at` reports `startedAt` (it never waited
    in a queue), an empty `events` is omitted, and a missing `stepId` reads as
    `<runId>:<seq>`."""

    run_id: str
    seq: int
    name: str
    kind: CheckpointKind
    step_id: str = field(metadata=json_field(read_fallback=_default_step_id))
    status: CheckpointStatus
    started_at: datetime
    finished_at: datetime
    attempts: int = 1
    input: JSONValue = None
    output: JSONValue = None
    error: StepError | None = None
    worker_group: str | None = None
    events: tuple[StepEvent, ...] | None = field(default=None, metadata=json_field(write="truthy"))
    wake_at: int | None = None
    parallel_group: str | None = None
    enqueued_at: datetime | None = field(
        default=None,
        metadata=json_field(read_fallback=_started_at_of, write_fallback=_started_at),
    )
    attempt_errors: tuple[AttemptError, ...] | None = field(
        default=None, metadata=json_field(write="truthy")
    )
    attempt_errors_omitted: int = field(default=0, metadata=json_field(write="truthy"))

    def with_attempt_error(self, attempt: int, at: int, error: StepError) -> StepCheckpoint:
        """This row with `error` recorded as the failure of `attempt` (at `at`, epoch ms)."""
        kept, omitted = add_attempt_error(
            self.attempt_errors, self.attempt_errors_omitted, attempt, at, error
        )
        return dataclasses.replace(self, attempt_errors=kept, attempt_errors_omitted=omitted)


@dataclass(frozen=True, slots=True)
class SignalWaiter(JsonObject):
    """A run waiting on a token (the token is the key): the checkpoint seq it waits at, and
    the fan group the delivered checkpoint joins."""

    token: str
    run_id: str
    seq: int
    parallel_group: str | None = None


@dataclass(frozen=True, slots=True)
class ChildWait:
    """One member of a fan registering its wait (`register_child_waits`): the waiter, and
    the `running` placeholder row to insert at its seq unless a row is already there."""

    waiter: SignalWaiter
    placeholder: StepCheckpoint | None = None


def delivered_signal(waiter: SignalWaiter, payload: JSONValue, at: datetime) -> StepCheckpoint:
    """The instant `signal:<token>` checkpoint a delivery writes at the waiter's seq (with
    the waiter's fan group, so a fan's join sees its member settled)."""
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
    """A hit from `take_buffered_signal_into`: the payload may itself be None (a buffered `None`
    is still a hit, unlike a miss, which is no `BufferedSignal` at all)."""

    payload: JSONValue


@dataclass(frozen=True, slots=True)
class BufferedEvent:
    """A published event kept until a waiter claims it."""

    id: str
    name: str
    payload: JSONValue
    published_at: int


AttributeOp = Literal["eq", "ne", "gt", "gte", "lt", "lte", "in"]
AttributeValue = str | int | float | bool


@dataclass(frozen=True, slots=True)
class AttributeFilter:
    """One search-attribute predicate. `in` uses `values`, every other op `value`."""

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
"""Sentinel: `RunQuery.origin` absent (no restriction). `None` means `origin IS NULL`."""


def is_set(value: object) -> TypeGuard[object]:
    return value is not UNSET


@dataclass(frozen=True, slots=True)
class RunQuery:
    """Run list filters. Every field is optional; plurals OR within, all AND."""

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
class RunResult(JsonObject):
    """What most engine operations return: a run's id, status and outcome."""

    run_id: str
    status: RunStatus
    output: JSONValue = None
    error: StepError | None = None


def checkpoint_name_kind(name: str) -> str:
    """What a checkpoint row stands for, by its name: a child's completion (`child`), a
    folded fan (`folded`), a spawned child (`spawn`) or a plain step (`step`)."""
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
    "ATTEMPT_ERRORS_FIRST",
    "ATTEMPT_ERRORS_LAST",
    "ATTEMPT_MESSAGE_MAX",
    "CHILD_EDGE_PREFIXES",
    "DEFAULT_CONCURRENCY_STATUSES",
    "HANDOFF_SEQ_BASE",
    "LIVE_RUN_STATUSES",
    "RUN_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "UNSET",
    "AttemptError",
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
    "add_attempt_error",
    "checkpoint_name_kind",
    "ms_from_utc",
    "now_utc",
    "replace",
    "utc_from_ms",
]
