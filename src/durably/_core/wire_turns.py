"""Remote workflow turns on the wire: what the engine sends a workflow worker and what comes back.

A remote workflow's body runs in a worker; the engine owns every durable fact about the run and
advances it one turn at a time:

- `WorkflowTask` (engine → worker) carries the run's input and its `history`, the outcomes of
  every operation so far, in seq order (`HistoryEvent`);
- the worker replays the body against that history and answers with a `WorkflowDecision`: a
  status and one `WorkflowCommand` per operation that is new this turn;
- while a turn replays, the worker streams the lifecycle of the local steps it executes
  (`WorkflowStepEvent`) and beats for the run (`RunHeartbeat`).

The shapes are shared with the published `durable-worker` SDK and TypeScript workers of the same
protocol, so keys and kinds must match them byte for byte. As for step messages (`wire.py`): keys
are camelCase, an optional key is omitted rather than sent as null, a null received reads as
absent, unknown keys are ignored. A worker tells a turn from a step task only by shape (a string
`workflow` AND a list `history`), which is why `history` is always sent, even empty.

Everything read from the wire is untrusted: `parse_*` accept only the right shape and raise
`WireFormatError` naming the message kind, its id (the decision's `taskId`, else its `runId`) and
the offending key. A decision that asks for a command kind this engine does not implement raises
`UnsupportedCommandError` (a `WireFormatError`), so a caller that drops malformed decisions also
drops it, before anything of that decision was applied.

Bounds (`_core/bounds.py`): a message must also be storable. Anywhere in it a `NaN` or
`Infinity`, a lone surrogate, a nesting deeper than `MAX_JSON_DEPTH` or a non-JSON value is
refused, as is a message whose JSON is over `max_bytes` (the engine's `max_payload_bytes`).
Integers are at most 2**53 - 1, times (`startedAt`, `finishedAt`, an event's `at`) at most the
last millisecond of year 9999 (the latest instant a timestamp column and a Python datetime
both hold), a sleep at most `MAX_SLEEP_MS`; names, ids and tokens are text without NUL and at
most `MAX_NAME_CHARS` long. Each refusal is a `WireFormatError` naming the message and the key.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from durably._core.bounds import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    PayloadRejectedError,
    check_json_value,
    check_size,
    check_text,
    check_wire_int,
    loads_untrusted,
)
from durably._core.models import HANDOFF_SEQ_BASE, JSONValue, StepError, StepEvent
from durably._core.wire import WireFormatError, WireReader, error_to_wire

__all__ = [
    "DECISION_KIND",
    "DECISION_STATUSES",
    "HEARTBEAT_KIND",
    "MAX_NAME_CHARS",
    "MAX_SLEEP_MS",
    "MAX_TIME_MS",
    "STEP_EVENT_KIND",
    "TASK_KIND",
    "CallCommand",
    "DecisionStatus",
    "HistoryEvent",
    "HistoryKind",
    "PendingSignal",
    "RecordStepCommand",
    "RunHeartbeat",
    "SleepCommand",
    "StartChildCommand",
    "StepPhase",
    "UnsupportedCommandError",
    "WaitSignalCommand",
    "WorkflowCommand",
    "WorkflowDecision",
    "WorkflowStepEvent",
    "WorkflowTask",
    "is_turn_task_of",
    "parse_run_heartbeat",
    "parse_workflow_decision",
    "parse_workflow_step_event",
    "parse_workflow_task",
    "turn_task_id",
]

TASK_KIND = "workflow task"
DECISION_KIND = "workflow decision"
STEP_EVENT_KIND = "workflow step event"
HEARTBEAT_KIND = "run heartbeat"

MAX_TIME_MS = 253_402_300_799_999
"""The last millisecond of year 9999: the latest time a wire timestamp may name."""

MAX_SLEEP_MS = 1000 * 365 * 24 * 3600 * 1000
"""The longest `sleep` a decision may ask for (a thousand years), so a deadline always stays
a time the store and the clock can represent."""

MAX_NAME_CHARS = 1024
"""The longest name, id, token or group a turn message may carry."""

HistoryKind = Literal["step", "call", "timer", "signal", "child"]
DecisionStatus = Literal["continue", "completed", "failed", "cancelled"]
StepPhase = Literal["running", "completed", "failed"]

HISTORY_KINDS: tuple[HistoryKind, ...] = ("step", "call", "timer", "signal", "child")
DECISION_STATUSES: tuple[DecisionStatus, ...] = ("continue", "completed", "failed", "cancelled")
STEP_PHASES: tuple[StepPhase, ...] = ("running", "completed", "failed")


def turn_task_id(run_id: str) -> str:
    """A fresh id for one turn of `run_id`: `<runId>:wf:<8 hex chars>`. Every turn gets a new
    one, so a decision can be matched to the one turn the run is waiting for."""
    return f"{run_id}:wf:{secrets.token_hex(4)}"


def is_turn_task_of(task_id: str, run_id: str) -> bool:
    """Whether `task_id` names a turn of `run_id` (other engines mint other suffixes)."""
    prefix = f"{run_id}:wf:"
    return task_id.startswith(prefix) and len(task_id) > len(prefix)


class UnsupportedCommandError(WireFormatError):
    """A decision asks for a command kind this engine does not implement."""

    def __init__(self, command_kind: str, message_id: str | None):
        problem = f"remote workflow command '{command_kind}' is not supported"
        super().__init__(DECISION_KIND, problem, message_id)
        self.command_kind = command_kind
        # Not "malformed": the decision is well formed, the engine lacks the command.
        self.args = (f"{DECISION_KIND} {message_id!r}: {problem}" if message_id else problem,)


# ------------------------------------------------------------------ engine → worker


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One resolved operation of the run, as the worker's replay reads it.

    Replay compares `kind` strictly and `name` only when the event has one, so the engine
    omits `name` where a worker could not know it (delivered signals, child completions).
    `output` is sent for a successful outcome of a kind that has one; a timer has none."""

    seq: int
    kind: HistoryKind
    name: str | None = None
    output: JSONValue = None
    error: StepError | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seq": self.seq, "kind": self.kind}
        if self.name is not None:
            out["name"] = self.name
        if self.error is not None:
            out["error"] = error_to_wire(self.error)
        elif self.kind != "timer":
            out["output"] = self.output
        return out


@dataclass(frozen=True, slots=True)
class PendingSignal:
    """A signal handed to a turn outside its history (durably never sends any: signals reach
    the replay through history; kept so a task from another engine parses)."""

    seq: int
    signal: str
    payload: JSONValue = None

    def to_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "signal": self.signal, "payload": self.payload}


@dataclass(frozen=True, slots=True)
class WorkflowTask:
    """One turn of a remote run, queued on the routing token `group`."""

    task_id: str
    run_id: str
    workflow: str
    workflow_version: str
    input: JSONValue
    history: tuple[HistoryEvent, ...]
    group: str
    attempt: int = 1
    pending_signals: tuple[PendingSignal, ...] | None = None
    priority: float | None = None
    traceparent: str | None = None
    transport: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "taskId": self.task_id,
            "runId": self.run_id,
            "workflow": self.workflow,
            "workflowVersion": self.workflow_version,
            "input": self.input,
            # Always a list: it is what tells a worker this is a turn, not a step task.
            "history": [event.to_json() for event in self.history],
        }
        if self.pending_signals is not None:
            out["pendingSignals"] = [s.to_json() for s in self.pending_signals]
        out["group"] = self.group
        out["attempt"] = self.attempt
        if self.priority is not None:
            out["priority"] = self.priority
        if self.traceparent is not None:
            out["traceparent"] = self.traceparent
        if self.transport is not None:
            out["transport"] = self.transport
        return out


# ------------------------------------------------------------------ worker → engine


@dataclass(frozen=True, slots=True)
class CallCommand:
    """Dispatch the step `name` (routed by name; `group` is a partition suffix, not a queue)."""

    seq: int
    name: str
    group: str
    input: JSONValue = None
    parallel_group: str | None = None
    kind: Literal["call"] = field(default="call", init=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "seq": self.seq,
            "name": self.name,
            "group": self.group,
            "input": self.input,
        }
        if self.parallel_group is not None:
            out["parallelGroup"] = self.parallel_group
        return out


@dataclass(frozen=True, slots=True)
class RecordStepCommand:
    """A local step the worker already executed this turn (its outcome, times and log)."""

    seq: int
    name: str
    output: JSONValue = None
    error: StepError | None = None
    started_at: int | None = None
    finished_at: int | None = None
    events: tuple[StepEvent, ...] = ()
    parallel_group: str | None = None
    kind: Literal["recordStep"] = field(default="recordStep", init=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "seq": self.seq, "name": self.name}
        if self.error is not None:
            out["error"] = error_to_wire(self.error)
        else:
            out["output"] = self.output
        if self.started_at is not None:
            out["startedAt"] = self.started_at
        if self.finished_at is not None:
            out["finishedAt"] = self.finished_at
        if self.events:
            out["events"] = [event.to_json() for event in self.events]
        if self.parallel_group is not None:
            out["parallelGroup"] = self.parallel_group
        return out


@dataclass(frozen=True, slots=True)
class SleepCommand:
    """Sleep `ms` from when the engine applies the command (the worker has no clock to trust)."""

    seq: int
    ms: int
    kind: Literal["sleep"] = field(default="sleep", init=False)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "seq": self.seq, "ms": self.ms}


@dataclass(frozen=True, slots=True)
class WaitSignalCommand:
    """Wait for the signal `signal` (the bare token a sender signals)."""

    seq: int
    signal: str
    kind: Literal["waitSignal"] = field(default="waitSignal", init=False)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "seq": self.seq, "signal": self.signal}


@dataclass(frozen=True, slots=True)
class StartChildCommand:
    """Start the child run `<runId>.child.<seq>` of `workflow` and wait for its outcome."""

    seq: int
    workflow: str
    input: JSONValue = None
    parallel_group: str | None = None
    kind: Literal["startChild"] = field(default="startChild", init=False)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "seq": self.seq,
            "workflow": self.workflow,
            "input": self.input,
        }
        if self.parallel_group is not None:
            out["parallelGroup"] = self.parallel_group
        return out


WorkflowCommand: TypeAlias = (
    CallCommand | RecordStepCommand | SleepCommand | WaitSignalCommand | StartChildCommand
)


@dataclass(frozen=True, slots=True)
class WorkflowDecision:
    """A worker's answer to one turn: what is new (`commands`, in seq order) and where the run
    stands (`status`; `output` when completed, `error` when failed)."""

    task_id: str
    run_id: str
    status: DecisionStatus
    commands: tuple[WorkflowCommand, ...] = ()
    output: JSONValue = None
    error: StepError | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "taskId": self.task_id,
            "runId": self.run_id,
            "status": self.status,
            "commands": [command.to_json() for command in self.commands],
        }
        if self.status == "completed":
            out["output"] = self.output
        if self.error is not None:
            out["error"] = error_to_wire(self.error)
        return out


@dataclass(frozen=True, slots=True)
class WorkflowStepEvent:
    """A local step's lifecycle, streamed while the turn replays (observational: the turn's
    `recordStep` is what the engine keeps)."""

    run_id: str
    seq: int
    name: str
    phase: StepPhase
    started_at: int
    finished_at: int | None = None
    output: JSONValue = None
    error: StepError | None = None
    events: tuple[StepEvent, ...] | None = None
    parallel_group: str | None = None
    task_id: str | None = None
    """The turn the step ran in, when the worker says (durable-worker does not)."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "runId": self.run_id,
            "seq": self.seq,
            "name": self.name,
            "phase": self.phase,
            "startedAt": self.started_at,
        }
        if self.finished_at is not None:
            out["finishedAt"] = self.finished_at
        if self.phase == "completed":
            out["output"] = self.output
        if self.error is not None:
            out["error"] = error_to_wire(self.error)
        if self.events is not None:
            out["events"] = [event.to_json() for event in self.events]
        if self.parallel_group is not None:
            out["parallelGroup"] = self.parallel_group
        if self.task_id is not None:
            out["taskId"] = self.task_id
        return out


@dataclass(frozen=True, slots=True)
class RunHeartbeat:
    """A worker's beat. Without `step_id` it is for a turn of the run being replayed (the run is
    alive, keep waiting for its decision); with one, for a single in-flight step."""

    run_id: str
    seq: int
    group: str
    step_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"runId": self.run_id, "seq": self.seq, "group": self.group}
        if self.step_id is not None:
            out["stepId"] = self.step_id
        return out


# ------------------------------------------------------------------ reading


class _Reader(WireReader):
    """A turn message's reader: bounded (module docstring), and positions stay below the
    engine's handoff range."""

    def __init__(self, kind: str, raw: object, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES):
        if isinstance(raw, (bytes, bytearray, str)):
            try:
                raw = loads_untrusted(raw, what=kind, max_bytes=max_bytes)
            except PayloadRejectedError as exc:
                raise WireFormatError(kind, exc.problem) from None
        super().__init__(kind, raw)
        # Named as early as possible, so a refusal of the whole message says which it was.
        for key in ("taskId", "runId"):
            value = self.data.get(key)
            if isinstance(value, str) and value and len(value) <= MAX_NAME_CHARS:
                self.ident = value.encode("utf-8", "backslashreplace").decode("utf-8")
                break
        try:
            check_json_value(kind, self.data)
            # Measured as sent: compact JSON in UTF-8 (no lone surrogate is left to encode).
            text = json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))
            check_size(kind, len(text.encode("utf-8")), max_bytes)
        except PayloadRejectedError as exc:
            raise self.fail(exc.problem) from None

    def string(self, data: Mapping[str, Any], key: str, where: str = "") -> str:
        return self._text(super().string(data, key, where), key, where)

    def optional_string(self, data: Mapping[str, Any], key: str, where: str = "") -> str | None:
        value = super().optional_string(data, key, where)
        return None if value is None else self._text(value, key, where)

    def _text(self, value: str, key: str, where: str) -> str:
        try:
            return check_text(f"`{where}{key}`", value, max_len=MAX_NAME_CHARS)
        except PayloadRejectedError as exc:
            raise self.fail(f"`{where}{key}` {exc.problem}") from None

    def integer(self, data: Mapping[str, Any], key: str, where: str = "") -> int:
        return self._bounded(super().integer(data, key, where), key, where)

    def time_ms(self, data: Mapping[str, Any], key: str, where: str = "") -> int:
        return self._bounded(self.integer(data, key, where), key, where, MAX_TIME_MS)

    def optional_time_ms(self, data: Mapping[str, Any], key: str, where: str = "") -> int | None:
        return None if data.get(key) is None else self.time_ms(data, key, where)

    def _bounded(self, value: int, key: str, where: str, maximum: int | None = None) -> int:
        try:
            if maximum is None:
                return check_wire_int(f"`{where}{key}`", value)
            return check_wire_int(f"`{where}{key}`", value, maximum=maximum)
        except PayloadRejectedError as exc:
            raise self.fail(f"`{where}{key}` is out of range: {exc.problem}") from None

    def events(self, value: object, where: str) -> tuple[StepEvent, ...]:
        if not isinstance(value, list) or not all(isinstance(e, dict) for e in value):
            raise self.fail(f"`{where}events` must be a list of objects")
        out: list[StepEvent] = []
        for i, item in enumerate(value):
            try:
                event = StepEvent.from_json(item)
            except (ValueError, TypeError) as exc:
                raise self.fail(f"`{where}events[{i}]` is not a step event ({exc})") from None
            if not 0 <= event.at <= MAX_TIME_MS:
                raise self.fail(f"`{where}events[{i}].at` is out of range ({event.at})")
            out.append(event)
        return tuple(out)

    def seq(self, data: Mapping[str, Any], where: str = "") -> int:
        seq = self.integer(data, "seq", where)
        # Positions from the handoff base up are the engine's own bookkeeping for onError;
        # a worker writing there would corrupt a routed run.
        if seq >= HANDOFF_SEQ_BASE:
            raise self.fail(f"`{where}seq` is in the range the engine reserves ({seq})")
        return seq


def parse_workflow_task(raw: object) -> WorkflowTask:
    """A WorkflowTask from its JSON (object, or JSON text)."""
    r = _Reader(TASK_KIND, raw)
    data = r.data
    r.ident = data.get("taskId") if isinstance(data.get("taskId"), str) else None
    task_id = r.string(data, "taskId")
    run_id = r.string(data, "runId")
    if not is_turn_task_of(task_id, run_id):
        raise r.fail("`taskId` is not `<runId>:wf:<suffix>`")
    workflow = r.string(data, "workflow")
    version = data.get("workflowVersion")
    if not isinstance(version, str):
        raise r.fail("`workflowVersion` must be a string")
    raw_history = data.get("history")
    if not isinstance(raw_history, list):
        raise r.fail("`history` must be a list")
    history = tuple(_history_event(r, item, i) for i, item in enumerate(raw_history))
    raw_signals = data.get("pendingSignals")
    signals: tuple[PendingSignal, ...] | None = None
    if raw_signals is not None:
        if not isinstance(raw_signals, list) or not all(isinstance(s, dict) for s in raw_signals):
            raise r.fail("`pendingSignals` must be a list of objects")
        signals = tuple(
            PendingSignal(
                seq=r.integer(s, "seq", f"pendingSignals[{i}]."),
                signal=r.string(s, "signal", f"pendingSignals[{i}]."),
                payload=s.get("payload"),
            )
            for i, s in enumerate(raw_signals)
        )
    priority = data.get("priority")
    if priority is not None and (
        isinstance(priority, bool) or not isinstance(priority, (int, float))
    ):
        raise r.fail("`priority` must be a number")
    return WorkflowTask(
        task_id=task_id,
        run_id=run_id,
        workflow=workflow,
        workflow_version=version,
        input=data.get("input"),
        history=history,
        group=r.string(data, "group"),
        attempt=max(1, r.optional_integer(data, "attempt") or 1),
        pending_signals=signals,
        priority=priority,
        traceparent=r.optional_string(data, "traceparent"),
        transport=r.optional_string(data, "transport"),
    )


def _history_event(r: _Reader, raw: object, index: int) -> HistoryEvent:
    where = f"history[{index}]."
    if not isinstance(raw, dict):
        raise r.fail(f"`history[{index}]` must be an object")
    kind = raw.get("kind")
    if kind not in HISTORY_KINDS:
        raise r.fail(f"`{where}kind` must be one of {', '.join(HISTORY_KINDS)}")
    error = raw.get("error")
    return HistoryEvent(
        seq=r.integer(raw, "seq", where),
        kind=kind,
        name=r.optional_string(raw, "name", where),
        output=raw.get("output"),
        error=r.error(error, where) if error is not None else None,
    )


def parse_workflow_decision(
    raw: object, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> WorkflowDecision:
    """A WorkflowDecision from its JSON (object, or JSON text), at most `max_bytes` of it.
    Raises `UnsupportedCommandError` for a command kind the engine does not implement,
    `WireFormatError` for anything else."""
    r = _Reader(DECISION_KIND, raw, max_bytes)
    data = r.data
    task_id = r.string(data, "taskId")
    run_id = r.string(data, "runId")
    r.ident = task_id
    if not is_turn_task_of(task_id, run_id):
        raise r.fail("`taskId` is not `<runId>:wf:<suffix>`")
    status = data.get("status")
    if status not in DECISION_STATUSES:
        raise r.fail(f"`status` must be one of {', '.join(DECISION_STATUSES)}")
    raw_commands = data.get("commands")
    if not isinstance(raw_commands, list):
        raise r.fail("`commands` must be a list")
    commands = tuple(_command(r, item, i) for i, item in enumerate(raw_commands))
    error = data.get("error")
    return WorkflowDecision(
        task_id=task_id,
        run_id=run_id,
        status=status,
        commands=commands,
        output=data.get("output") if status == "completed" else None,
        error=r.error(error, "") if error is not None else None,
    )


def _command(r: _Reader, raw: object, index: int) -> WorkflowCommand:
    where = f"commands[{index}]."
    if not isinstance(raw, dict):
        raise r.fail(f"`commands[{index}]` must be an object")
    kind = raw.get("kind")
    if not isinstance(kind, str) or not kind:
        raise r.fail(f"`{where}kind` must be a non-empty string")
    if kind == "call":
        return CallCommand(
            seq=r.seq(raw, where),
            name=r.string(raw, "name", where),
            # A missing group reads as the default partition (a bare token), as the SDK's
            # unified worker sends it.
            group=r.optional_string(raw, "group", where) or "default",
            input=raw.get("input"),
            parallel_group=r.optional_string(raw, "parallelGroup", where),
        )
    if kind == "recordStep":
        error = raw.get("error")
        events = raw.get("events")
        return RecordStepCommand(
            seq=r.seq(raw, where),
            name=r.string(raw, "name", where),
            output=raw.get("output") if error is None else None,
            error=r.error(error, where) if error is not None else None,
            started_at=r.optional_time_ms(raw, "startedAt", where),
            finished_at=r.optional_time_ms(raw, "finishedAt", where),
            events=r.events(events, where) if events is not None else (),
            parallel_group=r.optional_string(raw, "parallelGroup", where),
        )
    if kind == "sleep":
        return SleepCommand(seq=r.seq(raw, where), ms=_duration_ms(r, raw, where))
    if kind == "waitSignal":
        return WaitSignalCommand(seq=r.seq(raw, where), signal=r.string(raw, "signal", where))
    if kind == "startChild":
        return StartChildCommand(
            seq=r.seq(raw, where),
            workflow=r.string(raw, "workflow", where),
            input=raw.get("input"),
            parallel_group=r.optional_string(raw, "parallelGroup", where),
        )
    raise UnsupportedCommandError(kind, r.ident)


def _duration_ms(r: _Reader, raw: Mapping[str, Any], where: str) -> int:
    value = raw.get("ms")
    # The SDK passes the body's number through: a fractional millisecond rounds up, so a
    # sleep never ends early.
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise r.fail(f"`{where}ms` must be a non-negative number")
    if value > MAX_SLEEP_MS:
        raise r.fail(f"`{where}ms` is over the longest sleep, {MAX_SLEEP_MS} ms")
    return math.ceil(value)


def parse_workflow_step_event(
    raw: object, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> WorkflowStepEvent:
    """A WorkflowStepEvent from its JSON (object, or JSON text), at most `max_bytes` of it.
    `taskId` is optional (durable-worker sends none); when present it must name a turn of
    `runId`, and the engine then only takes the event for exactly that turn."""
    r = _Reader(STEP_EVENT_KIND, raw, max_bytes)
    data = r.data
    run_id = r.string(data, "runId")
    r.ident = run_id
    seq = r.seq(data)
    r.ident = f"{run_id}:{seq}"
    task_id = r.optional_string(data, "taskId")
    if task_id is not None and not is_turn_task_of(task_id, run_id):
        raise r.fail("`taskId` is not `<runId>:wf:<suffix>`")
    phase = data.get("phase")
    if phase not in STEP_PHASES:
        raise r.fail(f"`phase` must be one of {', '.join(STEP_PHASES)}")
    error = data.get("error")
    if phase == "failed" and error is None:
        raise r.fail("a failed step event needs `error`")
    events = data.get("events")
    return WorkflowStepEvent(
        run_id=run_id,
        seq=seq,
        name=r.string(data, "name"),
        phase=phase,
        started_at=r.time_ms(data, "startedAt"),
        finished_at=r.optional_time_ms(data, "finishedAt"),
        output=data.get("output") if phase == "completed" else None,
        error=r.error(error, "") if error is not None and phase == "failed" else None,
        events=r.events(events, "") if events is not None else None,
        parallel_group=r.optional_string(data, "parallelGroup"),
        task_id=task_id,
    )


def parse_run_heartbeat(raw: object, *, max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> RunHeartbeat:
    """A RunHeartbeat from its JSON (object, or JSON text), at most `max_bytes` of it."""
    r = _Reader(HEARTBEAT_KIND, raw, max_bytes)
    data = r.data
    run_id = r.string(data, "runId")
    r.ident = run_id
    return RunHeartbeat(
        run_id=run_id,
        seq=r.integer(data, "seq"),
        group=r.string(data, "group"),
        step_id=r.optional_string(data, "stepId"),
    )
