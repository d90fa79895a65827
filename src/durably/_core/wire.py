"""Messages that cross a process boundary to step workers, and the routing-token rules.

These shapes are shared with the published `durable-worker` SDK (and TypeScript workers of the
same protocol), so keys, token spelling and priority mapping must match it byte for byte:

- a step task (`RemoteTask`) goes from an engine to the worker serving the step's name on a
  routing token; the worker answers with a `StepResult` on the results channel;
- JSON keys are camelCase; an optional key is omitted rather than sent as null, and a null
  received is treated as absent (a worker sends `"code": null` for a `FatalError` without one);
- unknown keys are ignored (newer peers add fields).

Everything read from the wire is untrusted: `parse_*` accept only a JSON object of the right
shape and raise `WireFormatError` naming the message kind, the message's id when it has one, and
the offending key — callers log it and drop (or dead-letter) the message, never settle anything
from it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from durably._core.models import JSONValue, StepError, StepEvent

__all__ = [
    "RemoteTask",
    "StepResult",
    "WireFormatError",
    "WireReader",
    "effective_prefix",
    "error_from_wire",
    "error_to_wire",
    "parse_remote_task",
    "parse_step_result",
    "partition_of_token",
    "sanitize_queue_token",
    "step_id_of",
    "tenant_group",
    "to_broker_priority",
]


class WireFormatError(ValueError):
    """A message from a transport does not have the shape its kind requires."""

    def __init__(self, kind: str, problem: str, message_id: str | None = None):
        where = f"{kind} {message_id!r}" if message_id else kind
        super().__init__(f"malformed {where}: {problem}")
        self.kind = kind
        self.problem = problem
        self.message_id = message_id


# ------------------------------------------------------------------ routing tokens


def sanitize_queue_token(name: str) -> str:
    """A name as a queue token: BullMQ forbids `:` in queue names (`.`, `@`, `/` are kept).
    Not invertible: a step `orders:charge` lives on token `orders-charge`."""
    return name.replace(":", "-")


def tenant_group(base: str, tenant: str | None) -> str:
    """`base@tenant`, or the bare base for no tenant or the default one."""
    return f"{base}@{tenant}" if tenant not in (None, "", "default") else base


def effective_prefix(prefix: str, namespace: str | None) -> str:
    """The key prefix of a transport namespace (deployment isolation on one broker)."""
    return f"{prefix}-{namespace}" if namespace not in (None, "", "default") else prefix


def partition_of_token(token: str) -> str:
    """The partition a token is suffixed with (after the last `@`), else `default`."""
    return token.rsplit("@", 1)[1] if "@" in token else "default"


def step_id_of(run_id: str, seq: int) -> str:
    """A dispatched step's id: the same across re-dispatches and retries of that position."""
    return f"{run_id}:{seq}"


def to_broker_priority(priority: float | None) -> int | None:
    """Engine priority (higher = more urgent) as a BullMQ priority (lower runs first), rounded
    half up as JavaScript's Math.round does; None keeps plain FIFO."""
    if priority is None:
        return None
    return min(2_097_151, max(1, math.floor(1_048_576 - priority + 0.5)))


# ------------------------------------------------------------------ messages


@dataclass(frozen=True, slots=True)
class RemoteTask:
    """One attempt of a step, sent to the worker that serves `name` on token `group`."""

    run_id: str
    seq: int
    name: str
    step_id: str
    group: str
    input: JSONValue
    attempt: int
    traceparent: str | None = None
    context: Mapping[str, Any] | None = None
    transport: str | None = None
    priority: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "runId": self.run_id,
            "seq": self.seq,
            "name": self.name,
            "stepId": self.step_id,
            "group": self.group,
            "input": self.input,
            "attempt": self.attempt,
        }
        if self.traceparent is not None:
            out["traceparent"] = self.traceparent
        if self.context is not None:
            out["context"] = dict(self.context)
        if self.transport is not None:
            out["transport"] = self.transport
        if self.priority is not None:
            out["priority"] = self.priority
        return out


@dataclass(frozen=True, slots=True)
class StepResult:
    """A worker's answer for one step attempt."""

    run_id: str
    seq: int
    step_id: str
    status: Literal["completed", "failed"]
    output: JSONValue = None
    error: StepError | None = None
    started_at: int | None = None
    events: tuple[StepEvent, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "runId": self.run_id,
            "seq": self.seq,
            "stepId": self.step_id,
            "status": self.status,
        }
        if self.status == "completed":
            out["output"] = self.output
        if self.error is not None:
            out["error"] = error_to_wire(self.error)
        if self.started_at is not None:
            out["startedAt"] = self.started_at
        if self.events:
            out["events"] = [event.to_json() for event in self.events]
        return out


def error_to_wire(error: StepError) -> dict[str, Any]:
    out: dict[str, Any] = {"message": error.message}
    if error.code is not None:
        out["code"] = error.code
    if error.retryable is not None:
        out["retryable"] = error.retryable
    if error.details is not None:
        out["details"] = error.details
    if error.stack is not None:
        out["stack"] = error.stack
    return out


def error_from_wire(raw: object, kind: str, message_id: str | None) -> StepError:
    """A StepError from the wire: `message` a string; `code` a string or null (no code);
    `retryable` a bool or absent; `details` any JSON; `stack` a string or absent."""
    if not isinstance(raw, dict):
        raise WireFormatError(kind, "`error` must be an object", message_id)
    message = raw.get("message")
    if not isinstance(message, str):
        raise WireFormatError(kind, "`error.message` must be a string", message_id)
    code = raw.get("code")
    if code is not None and not isinstance(code, str):
        raise WireFormatError(kind, "`error.code` must be a string or null", message_id)
    retryable = raw.get("retryable")
    if retryable is not None and not isinstance(retryable, bool):
        raise WireFormatError(kind, "`error.retryable` must be a boolean", message_id)
    stack = raw.get("stack")
    if stack is not None and not isinstance(stack, str):
        stack = None  # observability only: a malformed stack is dropped, not fatal
    return StepError(
        message=message,
        code=code,
        details=raw.get("details"),
        retryable=retryable,
        stack=stack,
    )


class WireReader:
    """Strict reads of one message's keys; every problem names the kind, the message's id
    (`ident`, once read) and the key."""

    def __init__(self, kind: str, raw: object):
        if isinstance(raw, (bytes, bytearray, str)):
            try:
                raw = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise WireFormatError(kind, f"not JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise WireFormatError(kind, "not a JSON object")
        self.kind = kind
        self.data: dict[str, Any] = raw
        self.ident: str | None = None

    def fail(self, problem: str) -> WireFormatError:
        return WireFormatError(self.kind, problem, self.ident)

    def string(self, data: Mapping[str, Any], key: str, where: str = "") -> str:
        value = data.get(key)
        if not isinstance(value, str) or not value:
            raise self.fail(f"`{where}{key}` must be a non-empty string")
        return value

    def optional_string(self, data: Mapping[str, Any], key: str, where: str = "") -> str | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(f"`{where}{key}` must be a string")
        return value

    def integer(self, data: Mapping[str, Any], key: str, where: str = "") -> int:
        value = data.get(key)
        # bool is an int in Python; a JSON float with no fraction (7.0) is accepted as 7.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(f"`{where}{key}` must be a non-negative integer")
        return value

    def optional_integer(self, data: Mapping[str, Any], key: str, where: str = "") -> int | None:
        if data.get(key) is None:
            return None
        return self.integer(data, key, where)

    def error(self, value: object, where: str) -> StepError:
        try:
            return error_from_wire(value, self.kind, self.ident)
        except WireFormatError as exc:
            raise self.fail(exc.problem.replace("`error", f"`{where}error", 1)) from None

    def events(self, value: object, where: str) -> tuple[StepEvent, ...]:
        if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
            raise self.fail(f"`{where}events` must be a list of objects")
        return tuple(StepEvent.from_json(e) for e in value)


def parse_remote_task(raw: object) -> RemoteTask:
    """A RemoteTask from its JSON (object, or JSON text)."""
    r = WireReader("step task", raw)
    data = r.data
    r.ident = data.get("stepId") if isinstance(data.get("stepId"), str) else None
    if "history" in data:
        raise r.fail("has `history` (a workflow turn, not a step)")
    run_id = r.string(data, "runId")
    seq = r.integer(data, "seq")
    name = r.string(data, "name")
    step_id = r.string(data, "stepId")
    if step_id != step_id_of(run_id, seq):
        raise r.fail("`stepId` is not `<runId>:<seq>`")
    group = r.string(data, "group")
    attempt = r.integer(data, "attempt")
    context = data.get("context")
    if context is not None and not isinstance(context, dict):
        raise r.fail("`context` must be an object")
    priority = data.get("priority")
    if priority is not None and (
        isinstance(priority, bool) or not isinstance(priority, (int, float))
    ):
        raise r.fail("`priority` must be a number")
    traceparent = data.get("traceparent")
    transport = data.get("transport")
    return RemoteTask(
        run_id=run_id,
        seq=seq,
        name=name,
        step_id=step_id,
        group=group,
        input=data.get("input"),
        attempt=max(1, attempt),
        traceparent=traceparent if isinstance(traceparent, str) else None,
        context=context,
        transport=transport if isinstance(transport, str) else None,
        priority=priority,
    )


def parse_step_result(raw: object) -> StepResult:
    """A StepResult from its JSON (object, or JSON text)."""
    r = WireReader("step result", raw)
    data = r.data
    r.ident = data.get("stepId") if isinstance(data.get("stepId"), str) else None
    run_id = r.string(data, "runId")
    seq = r.integer(data, "seq")
    step_id = r.string(data, "stepId")
    if step_id != step_id_of(run_id, seq):
        raise r.fail("`stepId` is not `<runId>:<seq>`")
    status = data.get("status")
    if status not in ("completed", "failed"):
        raise r.fail("`status` must be 'completed' or 'failed'")
    error: StepError | None = None
    if status == "failed":
        if data.get("error") is None:
            raise r.fail("a failed result needs `error`")
        error = r.error(data["error"], "")
    raw_events = data.get("events")
    events = r.events(raw_events, "") if raw_events is not None else ()
    return StepResult(
        run_id=run_id,
        seq=seq,
        step_id=step_id,
        status=status,
        output=data.get("output") if status == "completed" else None,
        error=error,
        started_at=r.optional_integer(data, "startedAt"),
        events=events,
    )
