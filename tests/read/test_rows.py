"""`durably._read.rows`: what each kind of row the engine writes stands for, read from rows
shaped as the engine writes them (names, stored kinds, worker groups, seqs)."""

from __future__ import annotations

import base64
from dataclasses import replace
from datetime import timedelta

import pytest

from durably import StepCheckpoint
from durably._core.models import HANDOFF_SEQ_BASE, CheckpointKind, CheckpointStatus, ms_from_utc
from durably._read.rows import RowView, annotate, describe_row, describe_rows

from .builders import at, row

NOW = ms_from_utc(at(100))


def _row(
    seq: int,
    name: str,
    kind: CheckpointKind,
    status: CheckpointStatus = "completed",
    **changes: object,
) -> StepCheckpoint:
    return replace(row(seq, name, kind=kind, status=status), **changes)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


CASES = [
    (_row(0, "charge", "remote"), "in_process_step", "in-process step"),
    (_row(0, "charge", "remote", worker_group="charge"), "remote_step", "remote step"),
    (_row(0, "add", "local"), "local_step", "local step"),
    (_row(0, "sideEffect", "local"), "side_effect", "side effect"),
    (_row(0, "now", "local"), "recorded_time", "recorded time"),
    (_row(-1, "compensate:charge", "local"), "compensation", "compensation"),
    (_row(-2, "compensate:refund", "remote"), "compensation", "compensation"),
    (_row(0, "sleep", "sleep", wake_at=NOW), "sleep", "sleep"),
    (_row(0, "sleep:0", "sleep", "pending", wake_at=NOW), "sleep", "sleep"),
    (_row(0, "signal:approve", "signal"), "signal_wait", "signal wait"),
    (
        _row(0, f"signal:event:{_b64('paid')}:{_b64('{}')}:r#0", "signal"),
        "event_wait",
        "event wait",
    ),
    (_row(0, "signal:update:r:rename", "signal"), "update_wait", "update wait"),
    (_row(0, "signal:wh:abc", "signal"), "webhook_wait", "webhook wait"),
    (_row(0, "breakpoint", "signal", "pending"), "breakpoint", "breakpoint"),
    (_row(0, "breakpoint:review", "signal", "pending"), "breakpoint", "breakpoint"),
    (_row(0, "signal:bp:r:0", "signal"), "breakpoint", "breakpoint"),
    (_row(0, "signal:child:r.child.0", "signal"), "child", "child run"),
    (_row(0, "spawn:r.child.0", "local", output="r.child.0"), "spawn", "child started"),
    (_row(0, "fan:r.all.0", "signal", output={"count": 3}), "folded_fan", "folded fan members"),
    (_row(0, "event:progress", "local"), "set_event", "event set"),
    (_row(0, "patch:p1", "local"), "patch", "patch marker"),
    (
        _row(HANDOFF_SEQ_BASE, "signal:child:r.onError.1", "signal"),
        "on_error_handoff",
        "onError handoff",
    ),
    (
        _row(HANDOFF_SEQ_BASE, "handoff:retired:r.onError.1", "signal"),
        "retired_handoff",
        "retired onError handoff",
    ),
]


@pytest.mark.parametrize(("cp", "kind", "label"), CASES, ids=[c[0].name for c in CASES])
def test_each_row_reads_as_what_it_stands_for(cp: StepCheckpoint, kind: str, label: str) -> None:
    view = describe_row(cp, NOW)
    assert (view.kind, view.label) == (kind, label)
    assert view.engine is (kind == "retired_handoff")


def test_durations_only_where_the_row_says_them() -> None:
    step = _row(0, "charge", "remote", started_at=at(1), finished_at=at(3.5))
    assert describe_row(step, NOW).duration_ms == 2500
    running = _row(0, "charge", "remote", "pending", started_at=at(1), finished_at=at(1))
    assert describe_row(running, NOW).duration_ms is None
    failed = _row(0, "add", "local", "failed", started_at=at(1), finished_at=at(2))
    assert describe_row(failed, NOW).duration_ms == 1000
    # a delivery's row is written at the delivery: nothing says when the wait began
    signal = _row(0, "signal:approve", "signal", started_at=at(5), finished_at=at(5))
    assert describe_row(signal, NOW).duration_ms is None
    child = _row(0, "signal:child:r.c", "signal", started_at=at(5), finished_at=at(5))
    assert describe_row(child, NOW).duration_ms is None
    marker = _row(0, "event:k", "local", started_at=at(5), finished_at=at(5))
    assert describe_row(marker, NOW).duration_ms is None


def test_a_sleep_lasts_until_it_is_due() -> None:
    scheduled = at(10)
    slept = _row(
        3,
        "sleep",
        "sleep",
        started_at=scheduled,
        finished_at=scheduled,
        wake_at=ms_from_utc(scheduled) + 1000,
    )
    view = describe_row(slept, NOW)
    assert view.duration_ms == 1000 and view.state is None
    assert view.due_at == scheduled + timedelta(seconds=1)
    still = replace(slept, wake_at=NOW + 5000)
    assert describe_row(still, NOW).state == "sleeping"
    assert describe_row(still, NOW).to_json()["dueAt"].endswith("Z")


def _deadline(seq: int, name: str, wake: int) -> StepCheckpoint:
    return _row(seq, name, "sleep", started_at=at(10), finished_at=at(10), wake_at=wake)


def test_a_deadline_belongs_to_the_wait_after_it() -> None:
    due = ms_from_utc(at(40))
    deadline = _deadline(4, "timeout:approve", due)
    delivered = _row(5, "signal:approve", "signal", started_at=at(12), finished_at=at(12))
    views = describe_rows([deadline, delivered], NOW)
    assert views[4] == RowView(
        kind="timeout",
        label="timeout of signal wait approve",
        engine=True,
        owner=5,
        state="not_reached",
        duration_ms=30_000,
        due_at=at(40),
    )
    assert views[5].timeout_ms == 30_000
    assert views[5].duration_ms == 2000  # from the deadline's row (the wait began) to delivery
    assert views[5].to_json()["timeoutMs"] == 30_000

    alone = describe_rows([deadline], NOW)[4]
    assert alone.state == "fired" and alone.owner == 5
    armed = describe_rows([_deadline(4, "timeout:approve", NOW + 1)], NOW)[4]
    assert armed.state == "armed"


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("timeout:approve", "timeout of signal wait approve"),
        ("timeout:event:order.paid", "timeout of event wait order.paid"),
        ("timeout:update:r:1:rename", "timeout of update wait rename"),
        ("timeout:wh:abc", "timeout of webhook wait wh:abc"),
    ],
)
def test_a_deadline_names_its_wait(name: str, label: str) -> None:
    assert describe_row(_deadline(0, name, NOW), NOW).label == label


def test_a_fan_member_says_so_and_annotate_carries_every_view() -> None:
    member = _row(2, "charge", "remote", parallel_group="all:2:3", worker_group="charge")
    view = describe_row(member, NOW)
    assert view.label == "remote step · fan member" and view.fan_member
    out = annotate([member], None, NOW)
    assert out[0]["row"] == view.to_json()
    assert {k: v for k, v in out[0].items() if k != "row"} == member.to_json()
    assert view.to_json() == {
        "kind": "remote_step",
        "label": "remote step · fan member",
        "fanMember": True,
        "durationMs": 1000,
    }


@pytest.mark.parametrize(
    ("cp", "subject"),
    [
        (_row(0, "signal:approve", "signal"), "approve"),
        (_row(0, f"signal:event:{_b64('paid')}:{_b64('{}')}:r#0", "signal"), "paid"),
        (_row(0, "signal:update:r:rename", "signal"), "rename"),
        (_row(0, "signal:wh:abc", "signal"), "wh:abc"),
        (_row(0, "signal:child:r.child.0", "signal"), "r.child.0"),
        (_row(0, "sleep", "sleep", wake_at=NOW), None),
        (_row(0, "charge", "remote"), None),
    ],
)
def test_a_wait_says_what_it_waits_for(cp: StepCheckpoint, subject: str | None) -> None:
    assert describe_row(cp, NOW).waits_for == subject
    assert describe_row(cp, NOW).to_json().get("waitsFor") == subject
