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
from it. A step result is also checked for what the store could not hold (its size, a nesting
too deep, `NaN`, a lone surrogate, a number out of range); when such a result still names its
step readably, the error carries a `stand_in`: the failed result to settle in its place, so the
attempt fails with a clear error instead of waiting for an answer that was refused.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from durably._core.bounds import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_WIRE_INT,
    PayloadRejectedError,
    PayloadTooLargeError,
    check_json_value,
    check_wire_int,
    loads_untrusted,
)
from durably._core.errors import InvalidRunIdError
from durably._core.ids import validate_run_id
from durably._core.models import JSONValue, StepError, StepEvent

__all__ = [
    "INVALID_RESULT",
    "MAX_EPOCH_MS",
    "MAX_SEQ",
    "RESULT_TOO_LARGE",
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
    "vet_step_result",
]


class WireFormatError(ValueError):
    """A message from a transport does not have the shape its kind requires.

    `stand_in` is set only by `parse_step_result`: the failed result to settle in place of a
    refused result that still named its step readably (None: nothing can be matched to it)."""

    def __init__(self, kind: str, problem: str, message_id: str | None = None):
        where = f"{kind} {message_id!r}" if message_id else kind
        super().__init__(f"malformed {where}: {problem}")
        self.kind = kind
        self.problem = problem
        self.message_id = message_id
        self.stand_in: StepResult | None = None


MAX_SEQ: Final = 2**31 - 1
"""Largest step position a message may name: the stores keep `seq` in a 32-bit INTEGER."""

MAX_EPOCH_MS: Final = 253_402_300_799_999
"""Latest timestamp (epoch ms) a message may carry: 9999-12-31T23:59:59.999Z, the last instant
a Python datetime (and so a checkpoint) can hold."""

INVALID_RESULT: Final = "invalid_result"
"""`StepError.code` of an attempt failed because its result could not be read or stored."""

RESULT_TOO_LARGE: Final = "result_too_large"
"""`StepError.code` of an attempt failed because its result was over `max_payload_bytes`."""


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
    attempt: int | None = None
    """The attempt answered, when the worker says (durably's own workers do; the published
    durable-worker SDK does not, and peers ignore the key): what tells a late answer of an
    earlier attempt from the current one without comparing clocks."""

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
        if self.attempt is not None:
            out["attempt"] = self.attempt
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


_RESULT: Final = "step result"

# The fields a refused result is matched to its attempt by (see `_stand_in`).
_MATCH_KEYS: Final = frozenset({"runId", "seq", "stepId", "attempt", "startedAt"})


def parse_step_result(raw: object, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> StepResult:
    """A StepResult from its JSON: an object, or JSON text (str or UTF-8 bytes).

    Raises `WireFormatError` (and nothing else) for a message that cannot be used. Text is
    measured before it is parsed and refused unparsed when over `max_bytes` (an object handed
    in already parsed cannot be measured here: the caller that saw its bytes checks them).
    Every value must be one the store can hold: finite numbers, no lone surrogate, at most
    `MAX_JSON_DEPTH` levels; `seq` at most `MAX_SEQ`, `startedAt` and event times at most
    `MAX_EPOCH_MS`, `attempt` at least 1; the run id must obey the run-id rule.

    When a result is refused but its run id, seq and step id are readable and agree, the
    error's `stand_in` is a failed result for that step — code `result_too_large` or
    `invalid_result`, not retryable, with the message's `attempt` and `startedAt` when those
    are readable — so settling it fails the attempt it answered (and only that attempt: it is
    matched like any result) instead of leaving the attempt waiting for an answer that was
    refused."""
    if isinstance(raw, (str, bytes, bytearray)):
        try:
            data = _load_text(raw, max_bytes)
        except PayloadRejectedError as exc:
            fields = _leading_fields(raw)
            step_id = fields.get("stepId")
            error = WireFormatError(
                _RESULT, exc.problem, step_id if isinstance(step_id, str) else None
            )
            error.stand_in = _stand_in(fields, exc)
            raise error from None
        checked = True
    else:
        data, checked = raw, False
    if not isinstance(data, dict):  # (a JSON string holding JSON is not read a second time)
        raise WireFormatError(_RESULT, "not a JSON object")
    r = WireReader(_RESULT, data)
    data = r.data
    r.ident = data.get("stepId") if isinstance(data.get("stepId"), str) else None
    run_id = r.string(data, "runId")
    try:
        validate_run_id(run_id, what="`runId`")
    except InvalidRunIdError as exc:
        raise r.fail(str(exc)) from None
    seq = _bounded(r, "seq", r.integer(data, "seq"), MAX_SEQ)
    step_id = r.string(data, "stepId")
    if step_id != step_id_of(run_id, seq):
        raise r.fail("`stepId` is not `<runId>:<seq>`")
    try:
        return _read_result(r, run_id, seq, step_id, checked=checked)
    except WireFormatError as exc:
        exc.stand_in = _stand_in(data, PayloadRejectedError(_RESULT, exc.problem))
        raise


def vet_step_result(
    result: StepResult, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> StepResult | None:
    """For a transport that carries results as objects (in-process): `result` itself when
    `parse_step_result` would accept its wire form, else its stand-in (None: it names no step
    readably). The same rules as on the wire, so a handler's `NaN` fails its attempt here too
    instead of being offered to a store that can never write it."""
    try:
        text = json.dumps(result.to_json(), separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        ids = {"runId": result.run_id, "seq": result.seq, "stepId": result.step_id}
        ids |= {"attempt": result.attempt, "startedAt": result.started_at}
        return _stand_in(ids, PayloadRejectedError(_RESULT, f"not JSON ({exc})"))
    try:
        parse_step_result(text, max_bytes=max_bytes)
    except WireFormatError as exc:
        return exc.stand_in
    return result


def _read_result(
    r: WireReader, run_id: str, seq: int, step_id: str, *, checked: bool
) -> StepResult:
    data = r.data
    if not checked:  # text was checked while it was parsed
        try:
            check_json_value(_RESULT, data)
        except PayloadRejectedError as exc:
            raise r.fail(exc.problem) from None
    status = data.get("status")
    if status not in ("completed", "failed"):
        raise r.fail("`status` must be 'completed' or 'failed'")
    error: StepError | None = None
    if status == "failed":
        if data.get("error") is None:
            raise r.fail("a failed result needs `error`")
        error = r.error(data["error"], "")
    raw_events = data.get("events")
    events: tuple[StepEvent, ...] = ()
    if raw_events is not None:
        try:
            events = r.events(raw_events, "")
        except WireFormatError:
            raise
        except ValueError as exc:
            raise r.fail(f"`events`: {exc}") from None
        for event in events:
            if not 0 <= event.at <= MAX_EPOCH_MS:
                raise r.fail(f"`events[].at` {event.at} is not an epoch-ms time")
    started_at = r.optional_integer(data, "startedAt")
    if started_at is not None:
        _bounded(r, "startedAt", started_at, MAX_EPOCH_MS)
    attempt = r.optional_integer(data, "attempt")
    if attempt is not None:
        if attempt < 1:
            raise r.fail("`attempt` must be at least 1")
        _bounded(r, "attempt", attempt, MAX_WIRE_INT)
    return StepResult(
        run_id=run_id,
        seq=seq,
        step_id=step_id,
        status=status,
        output=data.get("output") if status == "completed" else None,
        error=error,
        started_at=started_at,
        events=events,
        attempt=attempt,
    )


def _bounded(r: WireReader, key: str, value: int, maximum: int) -> int:
    try:
        return check_wire_int(f"`{key}`", value, maximum=maximum)
    except PayloadRejectedError as exc:
        raise r.fail(f"`{key}` {exc.problem}") from None


def _load_text(raw: str | bytes | bytearray, max_bytes: int) -> Any:
    if isinstance(raw, str) and len(raw) > max_bytes:
        # Over the limit in any encoding (a character is at least one byte): refused without
        # parsing it, and measured without a copy when it is ASCII (as BullMQ's JSON is).
        size = len(raw) if raw.isascii() else len(raw.encode("utf-8", "surrogatepass"))
        raise PayloadTooLargeError(_RESULT, size, max_bytes)
    return loads_untrusted(raw, what=_RESULT, max_bytes=max_bytes)


def _whole(value: object) -> int | None:
    """A non-negative whole JSON number as an int (7.0 is 7), else None."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _stand_in(fields: Mapping[str, Any], refusal: PayloadRejectedError) -> StepResult | None:
    """The failed result settled in place of a refused one, or None when the refused one does
    not name its step readably (a run id obeying the rule, a seq, the matching step id)."""
    run_id, seq, step_id = fields.get("runId"), _whole(fields.get("seq")), fields.get("stepId")
    if not isinstance(run_id, str) or seq is None or seq > MAX_SEQ:
        return None
    if step_id != step_id_of(run_id, seq):
        return None
    try:
        validate_run_id(run_id)
    except InvalidRunIdError:
        return None
    attempt = _whole(fields.get("attempt"))
    if attempt is not None and not 1 <= attempt <= MAX_WIRE_INT:
        attempt = None
    started_at = _whole(fields.get("startedAt"))
    if started_at is not None and started_at > MAX_EPOCH_MS:
        started_at = None
    if isinstance(refusal, PayloadTooLargeError):
        code, details = RESULT_TOO_LARGE, {"size": refusal.size, "limit": refusal.limit}
    else:
        code, details = INVALID_RESULT, None
    return StepResult(
        run_id=run_id,
        seq=seq,
        step_id=step_id,
        status="failed",
        error=StepError(
            message=f"step result refused: {refusal.problem}",
            code=code,
            details=details,
            retryable=False,
        ),
        started_at=started_at,
        attempt=attempt,
    )


# ------------------------------------------------------------------ reading a refused result

# Tokens of JSON text, for walking the top level of an object without parsing its values.
_WS = re.compile(r"[ \t\n\r]*")
_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|NaN|-?Infinity")
_MARK = re.compile(r'[\[\]{}"]')
_SMALL = 1024  # longest key or value token worth decoding: ids and numbers are short
_SKIP_BUDGET = 5_000
"""Brackets and strings inside nested values a walk steps over before it gives up: enough for
any ordinary output before the ids, and a bound on the work (milliseconds) whatever the text."""


def _leading_fields(raw: str | bytes | bytearray) -> dict[str, Any]:
    """The top-level scalar fields among `_MATCH_KEYS` of a JSON object's text that cannot be
    parsed as a whole (too big, too deep, `NaN` somewhere, or broken further on), read up to
    the first place it stops being readable. Values are stepped over, never parsed: a string
    by finding its closing quote, a nested value by counting brackets (at most
    `_SKIP_BUDGET` of them), so the work stays small however big or deep the text is."""
    text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8", "replace")
    found: dict[str, Any] = {}
    budget = [_SKIP_BUDGET]
    i = _space(text, 0)
    if not text.startswith("{", i):
        return found
    i = _space(text, i + 1)
    while len(found) < len(_MATCH_KEYS):
        key_end = _string_end(text, i)
        if key_end is None:
            return found
        key = text[i:key_end]
        i = _space(text, key_end)
        if not text.startswith(":", i):
            return found
        i = _space(text, i + 1)
        end: int | None
        if text.startswith('"', i):
            end = _string_end(text, i)
        elif text.startswith(("[", "{"), i):
            end = _nesting_end(text, i, budget)
        else:
            token = _SCALAR.match(text, i)
            end = token.end() if token is not None else None
        if end is None:
            return found
        if len(key) <= _SMALL and end - i <= _SMALL:
            try:
                name, value = json.loads(key), json.loads(text[i:end])
            except ValueError:
                name = value = None
            if name in _MATCH_KEYS and name not in found:
                found[name] = value
        i = _space(text, end)
        if not text.startswith(",", i):
            return found
        i = _space(text, i + 1)
    return found


def _space(text: str, i: int) -> int:
    match = _WS.match(text, i)
    return match.end() if match is not None else i


def _string_end(text: str, i: int) -> int | None:
    """The end of the JSON string whose opening quote is at `i` (None: there is none)."""
    if not text.startswith('"', i):
        return None
    j = i
    while True:
        j = text.find('"', j + 1)
        if j < 0:
            return None
        k = j - 1
        while text[k] == "\\":
            k -= 1
        if (j - 1 - k) % 2 == 0:  # an even run of backslashes escapes nothing
            return j + 1


def _nesting_end(text: str, i: int, budget: list[int]) -> int | None:
    """The end of the array or object starting at `i` (None: it never closes, or closing it
    took more than the budget left)."""
    depth = 0
    while budget[0] > 0:
        budget[0] -= 1
        mark = _MARK.search(text, i)
        if mark is None:
            return None
        j = mark.start()
        if text[j] == '"':
            end = _string_end(text, j)
            if end is None:
                return None
            i = end
            continue
        depth += 1 if text[j] in "[{" else -1
        i = j + 1
        if depth == 0:
            return i
    return None
