"""Error classes and the code/details lookup (`code_of`, `details_of`, `error_of`)."""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from typing import Any

from durably._core.models import JSONValue, StepError

CONTROL_FLOW_SIGNAL = "__durably_control_flow__"


class DurablyError(Exception):
    """Base class of durably's own (non-control-flow) errors."""


class FatalError(DurablyError):
    """An error that is never retried.

    `code` routes onError handlers; `details` is any JSON value carried everywhere the failure
    goes (run error, completions, gather failures, settled items).
    """

    retryable = False

    def __init__(self, message: str, code: str | None = None, details: JSONValue = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = details


class NestedWorkflowCallError(FatalError):
    """A ctx primitive called from inside an in-process step body of the same run."""

    def __init__(self, run_id: str, primitive: str, step: str):
        super().__init__(
            f"ctx.{primitive}() was called inside step {step!r} of run {run_id}: workflow "
            "primitives may only be called from the workflow body, not from a step body",
            code="nested_workflow_call",
        )
        self.run_id = run_id
        self.primitive = primitive
        self.step = step


class NonDeterminismError(DurablyError):
    """The code asks for a different checkpoint than history recorded."""

    code = "non_determinism"

    def __init__(self, run_id: str, seq: int, expected: str, recorded: str):
        super().__init__(
            f'non-determinism at {run_id}#{seq}: code expects "{expected}" but history '
            f'recorded "{recorded}" — the workflow code changed under an in-flight run; '
            "register a new version or guard the change with ctx.patched()"
        )
        self.run_id = run_id
        self.seq = seq
        self.expected = expected
        self.recorded = recorded


class StepFailedError(FatalError):
    """A step failed for good; raised in the workflow body.

    durably: a `local_step` failure is raised as this error (the original exception is its
    `__cause__` when it happened in this turn) so that the live path and a replay of the
    recorded failure raise the same class — a body that catches it behaves identically
    after a crash. `step_error` is the recorded failure (`code`, `details` included). It is
    a FatalError, so `except FatalError as e: e.code` works for any failed step.
    """

    def __init__(self, step_error: StepError | None = None):
        step_error = step_error or StepError(message="step failed")
        super().__init__(step_error.message, step_error.code, step_error.details)
        self.step_error = step_error


class RemoteStepError(StepFailedError):
    """A dispatched step failed for good; raised in the workflow body."""

    def __init__(self, step_error: StepError | None = None):
        super().__init__(step_error or StepError(message="remote step failed"))


class RemoteStepTimeout(DurablyError):
    """A step with `timeout` gave no result within its window. Retryable."""

    def __init__(self, step_id: str, timeout_ms: int):
        super().__init__(f"step {step_id} timed out after {timeout_ms}ms")
        self.step_id = step_id
        self.timeout_ms = timeout_ms


class GatherItemFailure:
    """One failed member of a fan."""

    __slots__ = ("code", "details", "error", "id", "index")

    def __init__(
        self,
        index: int,
        id: str,
        error: str,
        code: str | None = None,
        details: JSONValue = None,
    ):
        self.index = index
        self.id = id
        self.error = error
        self.code = code
        self.details = details

    def __repr__(self) -> str:
        return f"GatherItemFailure(index={self.index}, id={self.id!r}, error={self.error!r})"


class GatherError(DurablyError):
    def __init__(self, failures: list[GatherItemFailure], total: int | None = None):
        ids = ", ".join(f.id for f in failures)
        super().__init__(
            f"ctx.all: {len(failures)} of {total if total is not None else '?'} "
            f"child(ren) failed: {ids}"
        )
        self.failures = failures
        self.total = total


class ConcurrencyLimitError(DurablyError):
    """A start refused because the concurrency quota of its key is full: `active` runs
    counted against `limit` (`@durably.workflow(concurrency=...)` or `start(...,
    concurrency=...)`). Nothing was created; a child start refused so fails the child's
    wait in its parent."""

    def __init__(self, workflow: str, key: str, limit: int, active: int):
        super().__init__(
            f'concurrency limit reached for key "{key}" ({active}/{limit} in flight); '
            f"{workflow} was not started — retry later"
        )
        self.workflow = workflow
        self.key = key
        self.limit = limit
        self.active = active


class SingletonQueueFullError(DurablyError):
    """A start refused because a singleton workflow's key already has `limit +
    max_queue_depth` active runs (`@durably.workflow(singleton=Singleton(...,
    max_queue_depth=...))`). Nothing was created."""

    def __init__(self, workflow: str, key: str, max_queue_depth: int):
        super().__init__(
            f'singleton queue for {workflow} key "{key}" is full ({max_queue_depth} waiting)'
        )
        self.workflow = workflow
        self.key = key
        self.max_queue_depth = max_queue_depth


class SignalTimeoutError(DurablyError):
    """A bounded wait expired. Catchable in the body."""

    def __init__(self, token: str, timeout_ms: int):
        super().__init__(f"timed out after {timeout_ms}ms waiting for {token!r}")
        self.token = token
        self.timeout_ms = timeout_ms


class RunFailedError(DurablyError):
    """`execute` / `RunHandle.result` of a run that did not complete."""

    def __init__(self, run_id: str, status: str, error: StepError | None):
        message = error.message if error else status
        super().__init__(f"run {run_id} {status}: {message}")
        self.run_id = run_id
        self.status = status
        self.error = error


class WorkflowNotFoundError(DurablyError, LookupError):
    """`start` of a workflow name (or name@version) that is not registered."""


class RunNotFoundError(DurablyError, LookupError):
    pass


class ScheduleAlreadyExistsError(DurablyError):
    """`schedules.create` of an id a schedule already has (persisted, or declared in code)."""

    def __init__(self, schedule_id: str, where: str = "persisted"):
        super().__init__(
            f'schedule "{schedule_id}" already exists ({where}); use upsert or update to change it'
        )
        self.schedule_id = schedule_id


class ScheduleNotFoundError(DurablyError, LookupError):
    """A schedule verb naming an id no schedule has."""

    def __init__(self, schedule_id: str):
        super().__init__(f'no schedule "{schedule_id}"')
        self.schedule_id = schedule_id


class RunIdConflictError(DurablyError):
    """`start` with a run id that already belongs to a run of another workflow."""

    def __init__(self, run_id: str, existing_workflow: str, requested_workflow: str):
        super().__init__(
            f"run id {run_id!r} already belongs to a run of workflow {existing_workflow!r}; "
            f"it cannot be reused to start {requested_workflow!r}"
        )
        self.run_id = run_id
        self.existing_workflow = existing_workflow
        self.requested_workflow = requested_workflow


class DuplicateRunError(DurablyError):
    """`start(..., dedup_id=..., on_duplicate="raise")` while a live run of the workflow
    holds that dedup id; `.run_id` is that run. Nothing was created."""

    def __init__(self, workflow: str, dedup_id: str, run_id: str):
        super().__init__(
            f"a run of {workflow!r} with dedup id {dedup_id!r} is still live ({run_id!r}); "
            "nothing was started"
        )
        self.workflow = workflow
        self.dedup_id = dedup_id
        self.run_id = run_id


def _shown_token(token: str) -> str:
    """A token for an error message: quoted, and cut short when a caller sent a huge one."""
    return repr(token if len(token) <= 200 else token[:200] + "…")


class ReservedTokenError(DurablyError, ValueError):
    """An external signal addressed a token the engine mints for its own waits (a child's
    completion, a breakpoint, an update, an event wait, …). Nothing was delivered or stored.

    `.token` is the refused token, `.kind` the human name of its kind."""

    def __init__(self, token: str, kind: str, hint: str | None = None):
        how = f" ({hint})" if hint else ""
        super().__init__(
            f"cannot signal {_shown_token(token)}: it is a {kind} token, reserved for the "
            f"engine's own waits; external signals cannot address it{how}"
        )
        self.token = token
        self.kind = kind


class SignalBufferFullError(DurablyError):
    """A signal nobody waits on yet could not be buffered: the per-token or per-namespace
    cap of buffered signals is reached. Nothing was stored.

    `.token`, `.scope` (`"token"` or `"namespace"`), `.namespace`, `.cap` and `.option`
    (the `Engine(...)` keyword that sets the cap)."""

    def __init__(self, token: str, scope: str, namespace: str, cap: int, option: str):
        where = (
            "for this token"
            if scope == "token"
            else f"in its namespace {_shown_token(namespace)} (the text before the first ':')"
        )
        super().__init__(
            f"signal {_shown_token(token)} refused: {cap} signals are already buffered {where}, "
            f"the cap set by Engine({option}=…); nothing was stored. Buffered signals are taken "
            f"when a run waits on their token, expire after the buffer TTL, and can be listed "
            f"and purged with `durably signals list|purge`; raise the cap with {option}"
        )
        self.token = token
        self.scope = scope
        self.namespace = namespace
        self.cap = cap
        self.option = option


class InputValidationError(DurablyError, ValueError):
    """The start input does not match the workflow's input annotation or validator."""

    def __init__(self, workflow: str, message: str, details: JSONValue = None):
        super().__init__(f"invalid input for workflow {workflow!r}: {message}")
        self.workflow = workflow
        self.details = details


class SerializationError(DurablyError, TypeError):
    """A value that must be stored is not JSON-serializable."""


class InvalidRunIdError(DurablyError, ValueError):
    """A run id that breaks the id rule (empty, not printable, over 255 bytes of UTF-8, not a
    str). `rule` names the broken rule: `"empty"`, `"not_printable"`, `"too_long"` or
    `"not_a_string"`. Raised before any store call: nothing is created."""

    def __init__(self, run_id: object, rule: str, message: str):
        super().__init__(message)
        self.run_id = run_id
        self.rule = rule


class SchemaVersionError(DurablyError):
    """The SQL store's schema was written by a newer durably than this one.

    Raised when the store is opened (and by `durably db upgrade`); nothing is changed. The
    remedy is to upgrade durably: an older durably cannot know what a newer schema means,
    and downgrading a schema would lose what the newer version stored."""

    def __init__(self, found: int, supported: int, where: str):
        super().__init__(
            f"the durably schema of {where} is at version {found}, newer than this durably "
            f"supports (version {supported}): it was written by a newer release of durably. "
            "Upgrade durably (pip install -U durably) in every process that uses this store; "
            "do not downgrade the schema or edit its tables — nothing was changed"
        )
        self.found = found
        self.supported = supported
        self.where = where


class StoreConnectionError(DurablyError, ConnectionError):
    """The store's database could not be reached: the message names the host and port and
    what failed (refused, unknown host, no answer within the connect timeout, the server
    refused the login). A `ConnectionError`, so `except OSError` keeps catching it."""

    def __init__(self, message: str, *, host: str | None = None, port: int | None = None):
        super().__init__(message)
        self.message = message
        self.host = host
        self.port = port

    def __str__(self) -> str:
        return self.message


class StoreConnectTimeoutError(StoreConnectionError, TimeoutError):
    """No connection within the connect timeout (also a `TimeoutError`)."""


# ------------------------------------------------------------------ control flow signals
# Derived from BaseException so `except Exception` in a body cannot swallow
# them. They carry the CONTROL_FLOW_SIGNAL marker that
# `is_workflow_control_flow_signal` tests.


class _ControlFlow(BaseException):
    __durably_control_flow__ = True


class WorkflowBlocked(_ControlFlow):
    """No live worker offers what the run's next step requires (`@durably.step(requires=…)`):
    the turn ends and the run is parked `blocked` (its error says why), then re-checked every
    few seconds and resumed once such a worker appears. A control-flow signal, like a
    suspension: a body's `except Exception` never sees it."""

    def __init__(
        self,
        reason: str,
        code: str = "capability.unavailable",
        *,
        requires: tuple[str, ...] = (),
        diagnostics: JSONValue = None,
    ):
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.requires = requires
        self.diagnostics = diagnostics


class WorkflowSuspended(_ControlFlow):
    def __init__(self, wake_at: int | None = None):
        super().__init__("workflow suspended")
        self.wake_at = wake_at


class ContinueAsNew(_ControlFlow):
    def __init__(self, input: JSONValue):
        super().__init__("continue as new")
        self.input = input


class RunEvicted(_ControlFlow):
    """A resident run's coroutine is dropped; its state is already durable."""


def is_workflow_control_flow_signal(err: BaseException) -> bool:
    return bool(getattr(err, CONTROL_FLOW_SIGNAL, False))


# ------------------------------------------------------------------ code_of / details_of
# The code and details of an error: its own attributes, else those of the StepError it
# wraps (`step_error`, or `error`), else a mapping's keys.


def _lookup(err: BaseException | Mapping[str, Any] | None, key: str) -> Any:
    if err is None:
        return None
    if isinstance(err, Mapping):
        return err.get(key)
    value = getattr(err, key, None)
    if value is not None:
        return value
    step_error = getattr(err, "step_error", None)
    if isinstance(step_error, StepError):
        return getattr(step_error, key)
    inner = getattr(err, "error", None)
    if isinstance(inner, StepError):
        return getattr(inner, key)
    if isinstance(inner, Mapping):
        return inner.get(key)
    return None


def code_of(err: BaseException | Mapping[str, Any] | None) -> str | None:
    value = _lookup(err, "code")
    return value if isinstance(value, str) else None


def details_of(err: BaseException | Mapping[str, Any] | None) -> JSONValue:
    return _lookup(err, "details")


def error_of(err: BaseException, *, with_stack: bool = True) -> StepError:
    """The StepError recorded for a failed body or step: message, stack (optional), and
    the error's code and details."""
    if isinstance(err, StepFailedError) and err.step_error is not None:
        se = err.step_error
        return StepError(message=se.message, code=se.code, details=se.details, stack=se.stack)
    message = str(err) or type(err).__name__
    stack = None
    if with_stack and err.__traceback__ is not None:
        stack = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    retryable = getattr(err, "retryable", None)
    return StepError(
        message=message,
        code=code_of(err),
        details=details_of(err),
        retryable=retryable if isinstance(retryable, bool) else None,
        stack=stack,
    )


class StoreFailure(_ControlFlow):
    """The store failed under a running turn. Delivered as a control-flow signal
    so `except Exception` in a body cannot swallow it and carry on with undurable state: the
    turn ends unsettled, its lease lapses or is released, and recovery resumes the run from
    its last durable checkpoint once the store is back."""

    def __init__(self, cause: BaseException):
        super().__init__(f"store failure: {type(cause).__name__}: {cause}")
        self.cause = cause
