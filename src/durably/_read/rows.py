"""What each timeline row stands for, read from the row itself: its true kind, its real
duration, and whether the engine wrote it for its own bookkeeping.

The stored `kind` column says how a row is written and replayed (`local`, `remote`, `sleep`,
`signal`), not what the workflow did: an in-process `ctx.step` is stored as `remote` (it goes
through the same transport interface), a signal wait, a child and an onError handoff are all
`signal`, the deadline of a wait with a timeout is a `sleep`. `describe_rows` reads the
name, seq, stored kind and worker group of each row and answers a `RowView`:

- `kind` — the machine name (`RowKind`) and `label` — the words the console shows, e.g.
  "in-process step" or "timeout of signal wait approve".
- `duration_ms` — only where the row's timestamps say it truly: a settled step
  (finished - started); a sleep or a wait's deadline (due - scheduled, whether it has fired
  yet or not: a sleep row is written once, when it is scheduled, so its finish time is the
  scheduling time); a wait with a timeout (the deadline row was written when the wait began,
  the wait's row when it ended). Absent elsewhere: a delivered signal's or child's row is
  written at delivery with every timestamp set to that moment, so the store does not say
  when the wait began — an absent duration is honest where "0 ms" was not.
- `waits_for` — on a wait, what it waits for in words: the signal's token, the event's or
  the update's name, the child's run id.
- `attempt_spans` — on a step that failed an attempt, each attempt as a span of time,
  read from the row's failure history (`durably._read.attempts`: which starts are known).
- `engine` — rows the engine writes for itself and no workflow line asked for by that
  name: the deadline of a wait with a timeout (`timeout:<token>`, just before the wait's
  own position: `owner` is the wait's seq) and a retired onError handoff.
- `state` — a sleep or deadline still to come says so (`sleeping`, `armed`); a deadline
  says whether it `fired` (its wait has no row: it ended by the timeout) or was
  `not_reached` (the wait ended first). A sleep row is written `completed` when it is
  scheduled, so its stored status alone would say "completed" while the run still sleeps.

Decision: names are the only discriminator for rows of the same stored kind (a local step
a workflow names `sideEffect` or `now` reads as the primitive of that name); the engine
chooses these names and a workflow seldom does.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from durably._core.jsonshape import JsonObject, json_field
from durably._core.models import HANDOFF_SEQ_BASE, StepCheckpoint, ms_from_utc, utc_from_ms
from durably._read.attempts import AttemptSpan, attempt_spans

__all__ = [
    "ENGINE_ROW_KINDS",
    "RowKind",
    "RowView",
    "annotate",
    "describe_row",
    "describe_rows",
]

RowKind = Literal[
    "local_step",
    "in_process_step",
    "remote_step",
    "side_effect",
    "recorded_time",
    "compensation",
    "sleep",
    "timeout",
    "signal_wait",
    "event_wait",
    "update_wait",
    "webhook_wait",
    "breakpoint",
    "child",
    "spawn",
    "folded_fan",
    "set_event",
    "patch",
    "on_error_handoff",
    "retired_handoff",
]
ENGINE_ROW_KINDS: frozenset[str] = frozenset({"timeout", "retired_handoff"})
"""Kinds of the rows the engine writes for its own bookkeeping (`RowView.engine`)."""

RowState = Literal["sleeping", "armed", "fired", "not_reached"]

_LABELS: Mapping[str, str] = {
    "local_step": "local step",
    "in_process_step": "in-process step",
    "remote_step": "remote step",
    "side_effect": "side effect",
    "recorded_time": "recorded time",
    "compensation": "compensation",
    "sleep": "sleep",
    "timeout": "timeout",
    "signal_wait": "signal wait",
    "event_wait": "event wait",
    "update_wait": "update wait",
    "webhook_wait": "webhook wait",
    "breakpoint": "breakpoint",
    "child": "child run",
    "spawn": "child started",
    "folded_fan": "folded fan members",
    "set_event": "event set",
    "patch": "patch marker",
    "on_error_handoff": "onError handoff",
    "retired_handoff": "retired onError handoff",
}
_TIMEOUT = "timeout:"
_SIGNAL = "signal:"
_CHILD = "signal:child:"
_STEP_KINDS = frozenset(
    {
        "local_step",
        "in_process_step",
        "remote_step",
        "side_effect",
        "recorded_time",
        "compensation",
    }
)
_WAIT_KINDS = frozenset({"signal_wait", "event_wait", "update_wait", "webhook_wait"})


@dataclass(frozen=True, slots=True)
class RowView(JsonObject, dates="iso_ms"):
    """What one timeline row stands for (module docstring). JSON:
    `{kind, label, engine?, owner?, fanMember?, state?, durationMs?, dueAt?, timeoutMs?,
    waitsFor?, attemptSpans?}`."""

    kind: RowKind
    label: str
    engine: bool = field(default=False, metadata=json_field(write="truthy"))
    owner: int | None = None
    fan_member: bool = field(default=False, metadata=json_field(write="truthy"))
    state: RowState | None = None
    duration_ms: int | None = None
    due_at: datetime | None = None
    #: On a wait with a timeout: how long it was allowed to wait.
    timeout_ms: int | None = None
    #: On a wait: what it waits for, in words (a signal's token, an event's or an update's
    #: name, a child's run id).
    waits_for: str | None = None
    #: On a step that failed an attempt: every attempt as a span of time (`attempts`).
    attempt_spans: tuple[AttemptSpan, ...] = field(default=(), metadata=json_field(write="truthy"))


def _b64_text(text: str) -> str | None:
    try:
        return base64.b64decode(text, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None


def _wait_subject(token: str) -> tuple[RowKind, str]:
    """A wait token → the kind of wait and what it waits for, in words."""
    if token.startswith("event:"):
        parts = token.split(":")
        name = _b64_text(parts[1]) if len(parts) > 1 else None
        return "event_wait", name if name is not None else token
    if token.startswith("update:"):
        # `update:<runId>:<name>`; a run id may hold `:`, the update name is the last part.
        return "update_wait", token.rsplit(":", 1)[-1]
    if token.startswith("wh:"):
        return "webhook_wait", token
    return "signal_wait", token


def _kind_of(cp: StepCheckpoint) -> RowKind:
    name = cp.name
    if cp.kind == "sleep":
        return "timeout" if name.startswith(_TIMEOUT) else "sleep"
    if name.startswith("compensate:") and cp.seq < 0:
        return "compensation"
    if name.startswith("handoff:retired:"):
        return "retired_handoff"
    if name.startswith("fan:"):
        return "folded_fan"
    if name.startswith("signal:child:"):
        return "on_error_handoff" if cp.seq >= HANDOFF_SEQ_BASE else "child"
    if cp.kind == "signal":
        if name == "breakpoint" or name.startswith(("breakpoint:", "signal:bp:")):
            return "breakpoint"
        if name.startswith(_SIGNAL):
            return _wait_subject(name[len(_SIGNAL) :])[0]
        return "signal_wait"
    if cp.kind == "remote":
        # Sent to a worker over a transport: the dispatch names the worker group it went to.
        # An in-process `ctx.step` is written through the same path without one.
        return "remote_step" if cp.worker_group else "in_process_step"
    if name.startswith("spawn:"):
        return "spawn"
    if name.startswith("event:"):
        return "set_event"
    if name.startswith("patch:"):
        return "patch"
    if name == "sideEffect":
        return "side_effect"
    if name == "now":
        return "recorded_time"
    return "local_step"


def _timeout_label(cp: StepCheckpoint) -> str:
    kind, subject = _wait_subject(cp.name[len(_TIMEOUT) :])
    if kind == "event_wait" and cp.name.startswith(_TIMEOUT + "event:"):
        # A wait_for_event deadline is named `timeout:event:<name>` (the plain name).
        subject = cp.name[len(_TIMEOUT + "event:") :]
    return f"timeout of {_LABELS[kind]} {subject}"


def _span_ms(start: datetime, end: datetime) -> int:
    return max(0, ms_from_utc(end) - ms_from_utc(start))


def _settled(cp: StepCheckpoint) -> bool:
    return cp.status in ("completed", "failed")


def describe_row(
    cp: StepCheckpoint,
    now_ms: int,
    *,
    deadline: StepCheckpoint | None = None,
    owner: StepCheckpoint | None = None,
) -> RowView:
    """The view of one row. `deadline` is the `timeout:` row of the wait `cp` is (the row
    just before it), `owner` the wait row of the deadline `cp` is (the row just after it);
    leave them out where the neighbours are not at hand (a fan page's members have none)."""
    kind = _kind_of(cp)
    name = cp.name
    label = _LABELS[kind]
    view: dict[str, Any] = {"kind": kind, "label": label}
    if cp.parallel_group is not None and kind not in ENGINE_ROW_KINDS:
        view["label"] = label + " · fan member"
        view["fan_member"] = True
    if kind in ENGINE_ROW_KINDS:
        view["engine"] = True
    if kind in ("sleep", "timeout") and cp.wake_at is not None:
        view["due_at"] = utc_from_ms(cp.wake_at)
        view["duration_ms"] = max(0, cp.wake_at - ms_from_utc(cp.started_at))
    elif kind in _STEP_KINDS and _settled(cp):
        view["duration_ms"] = _span_ms(cp.started_at, cp.finished_at)
    if kind in _WAIT_KINDS:
        token = name[len(_SIGNAL) :] if name.startswith(_SIGNAL) else name
        view["waits_for"] = _wait_subject(token)[1]
    elif kind in ("child", "on_error_handoff"):
        view["waits_for"] = name[len(_CHILD) :]
    if kind in _STEP_KINDS and cp.attempt_errors:
        view["attempt_spans"] = attempt_spans(cp)
    if kind == "sleep" and cp.wake_at is not None and cp.wake_at > now_ms:
        view["state"] = "sleeping"
    if kind == "timeout":
        view["label"] = _timeout_label(cp)
        view["owner"] = cp.seq + 1
        if owner is not None and owner.seq == cp.seq + 1 and _settled(owner):
            view["state"] = "not_reached"
        elif cp.wake_at is not None and cp.wake_at > now_ms:
            view["state"] = "armed"
        elif cp.wake_at is not None:
            view["state"] = "fired"
    if (
        kind in _WAIT_KINDS
        and deadline is not None
        and deadline.seq == cp.seq - 1
        and _kind_of(deadline) == "timeout"
    ):
        if deadline.wake_at is not None:
            view["timeout_ms"] = max(0, deadline.wake_at - ms_from_utc(deadline.started_at))
        if _settled(cp):
            # The deadline was written as the wait began, the wait's row when it ended.
            view["duration_ms"] = _span_ms(deadline.started_at, cp.finished_at)
    return RowView(**view)


def describe_rows(timeline: Iterable[StepCheckpoint], now_ms: int) -> dict[int, RowView]:
    """seq → view for every row, each read with its neighbours (a wait and its deadline)."""
    rows = list(timeline)
    by_seq = {cp.seq: cp for cp in rows}
    return {
        cp.seq: describe_row(
            cp, now_ms, deadline=by_seq.get(cp.seq - 1), owner=by_seq.get(cp.seq + 1)
        )
        for cp in rows
    }


def annotate(
    rows: Sequence[StepCheckpoint], views: Mapping[int, RowView] | None, now_ms: int
) -> list[dict[str, Any]]:
    """The rows' JSON, each with its view under `row` (`views` by seq; a row without one is
    described alone)."""
    out = []
    for cp in rows:
        view = views.get(cp.seq) if views is not None else None
        if view is None:
            view = describe_row(cp, now_ms)
        out.append({**cp.to_json(), "row": view.to_json()})
    return out
