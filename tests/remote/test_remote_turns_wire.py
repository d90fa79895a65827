"""The wire shapes of remote workflow turns: exact JSON out, strict parsing in.

What a worker sends is untrusted: every malformed message must be refused with an error that
names the message kind, its id and the offending key, before anything of it is applied. The
shapes themselves are checked against the published SDK in test_remote_turns.py (its replay
reads these tasks and writes these decisions); here each shape is pinned key by key.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from durably import StepError, StepEvent
from durably._core.models import HANDOFF_SEQ_BASE
from durably._core.wire import WireFormatError
from durably._core.wire_turns import (
    CallCommand,
    HistoryEvent,
    RecordStepCommand,
    RunHeartbeat,
    SleepCommand,
    StartChildCommand,
    UnsupportedCommandError,
    WaitSignalCommand,
    WorkflowDecision,
    WorkflowStepEvent,
    WorkflowTask,
    is_turn_task_of,
    parse_run_heartbeat,
    parse_workflow_decision,
    parse_workflow_step_event,
    parse_workflow_task,
    turn_task_id,
)


def test_turn_task_ids_are_fresh_and_name_their_run() -> None:
    ids = {turn_task_id("run:1") for _ in range(50)}
    assert len(ids) == 50
    for task_id in ids:
        assert re.fullmatch(r"run:1:wf:[0-9a-f]{8}", task_id)
        assert is_turn_task_of(task_id, "run:1")
        assert not is_turn_task_of(task_id, "run")
    assert not is_turn_task_of("run:1:wf:", "run:1")


def test_a_task_always_carries_a_history_list_and_omits_absent_keys() -> None:
    task = WorkflowTask(
        task_id="r:wf:0123abcd",
        run_id="r",
        workflow="orders",
        workflow_version="2",
        input={"id": 7},
        history=(),
        group="orders@acme",
    )
    assert json.dumps(task.to_json()) == json.dumps(
        {
            "taskId": "r:wf:0123abcd",
            "runId": "r",
            "workflow": "orders",
            "workflowVersion": "2",
            "input": {"id": 7},
            "history": [],
            "group": "orders@acme",
            "attempt": 1,
        }
    )
    assert parse_workflow_task(task.to_json()) == task


def test_history_events_carry_name_output_and_error_only_where_replay_reads_them() -> None:
    events = [
        HistoryEvent(seq=0, kind="call", name="py.a", output=None),
        HistoryEvent(seq=1, kind="step", name="now#1", output=5),
        HistoryEvent(seq=2, kind="timer", name="sleep:2"),
        HistoryEvent(seq=3, kind="signal", output={"p": 1}),
        HistoryEvent(seq=4, kind="child", error=StepError(message="x", code="c", details=[1])),
    ]
    assert [e.to_json() for e in events] == [
        {"seq": 0, "kind": "call", "name": "py.a", "output": None},
        {"seq": 1, "kind": "step", "name": "now#1", "output": 5},
        {"seq": 2, "kind": "timer", "name": "sleep:2"},
        {"seq": 3, "kind": "signal", "output": {"p": 1}},
        {"seq": 4, "kind": "child", "error": {"message": "x", "code": "c", "details": [1]}},
    ]
    task = WorkflowTask("r:wf:1", "r", "w", "1", None, tuple(events), "w", priority=3)
    assert parse_workflow_task(json.dumps(task.to_json())) == task


def test_every_command_and_a_decision_round_trip_in_the_sdks_shape() -> None:
    commands = (
        CallCommand(seq=0, name="py.a", group="default", input=[1], parallel_group="gather:0"),
        RecordStepCommand(
            seq=1,
            name="now#1",
            output=99,
            started_at=10,
            finished_at=12,
            events=(StepEvent(at=11, level="info", message="hi"),),
        ),
        RecordStepCommand(seq=2, name="sideEffect", error=StepError(message="no", stack="tb")),
        SleepCommand(seq=3, ms=250),
        WaitSignalCommand(seq=4, signal="approve"),
        StartChildCommand(seq=5, workflow="leaf", input={"x": 1}),
    )
    decision = WorkflowDecision("r:wf:abcdef01", "r", "continue", commands)
    wire = decision.to_json()
    assert wire["commands"] == [
        {
            "kind": "call",
            "seq": 0,
            "name": "py.a",
            "group": "default",
            "input": [1],
            "parallelGroup": "gather:0",
        },
        {
            "kind": "recordStep",
            "seq": 1,
            "name": "now#1",
            "output": 99,
            "startedAt": 10,
            "finishedAt": 12,
            "events": [{"at": 11, "level": "info", "message": "hi"}],
        },
        {
            "kind": "recordStep",
            "seq": 2,
            "name": "sideEffect",
            "error": {"message": "no", "stack": "tb"},
        },
        {"kind": "sleep", "seq": 3, "ms": 250},
        {"kind": "waitSignal", "seq": 4, "signal": "approve"},
        {"kind": "startChild", "seq": 5, "workflow": "leaf", "input": {"x": 1}},
    ]
    assert "output" not in wire and "error" not in wire
    assert parse_workflow_decision(json.dumps(wire)) == decision
    done = WorkflowDecision("r:wf:1", "r", "completed", (), output=None)
    assert done.to_json() == {
        "taskId": "r:wf:1",
        "runId": "r",
        "status": "completed",
        "commands": [],
        "output": None,
    }


def test_a_decision_reads_null_as_absent_and_ignores_unknown_keys() -> None:
    decision = parse_workflow_decision(
        {
            "taskId": "r:wf:1",
            "runId": "r",
            "status": "failed",
            "commands": [{"kind": "call", "seq": 0, "name": "a", "group": None, "extra": 1}],
            "error": {"message": "bad", "code": None, "retryable": False},
            "future": {"key": True},
        }
    )
    assert decision.error == StepError(message="bad", retryable=False)
    assert decision.commands == (CallCommand(seq=0, name="a", group="default"),)
    # A fractional sleep rounds up: it never ends early.
    sleep = parse_workflow_decision(
        {
            "taskId": "r:wf:1",
            "runId": "r",
            "status": "continue",
            "commands": [{"kind": "sleep", "seq": 0, "ms": 1.2}],
        }
    )
    assert sleep.commands == (SleepCommand(seq=0, ms=2),)


GOOD: dict[str, Any] = {
    "taskId": "r:wf:0123abcd",
    "runId": "r",
    "status": "continue",
    "commands": [],
}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"taskId": 7}, "`taskId` must be a non-empty string"),
        ({"runId": ""}, "`runId` must be a non-empty string"),
        ({"runId": "s"}, "`taskId` is not `<runId>:wf:<suffix>`"),
        ({"status": "done"}, "`status` must be one of continue, completed, failed, cancelled"),
        ({"commands": None}, "`commands` must be a list"),
        ({"commands": [3]}, "`commands[0]` must be an object"),
        ({"commands": [{"seq": 0}]}, "`commands[0].kind` must be a non-empty string"),
        (
            {"commands": [{"kind": "call", "seq": True, "name": "a"}]},
            "`commands[0].seq` must be a non-negative integer",
        ),
        ({"commands": [{"kind": "call", "seq": 0}]}, "`commands[0].name` must be a non-empty"),
        (
            {"commands": [{"kind": "call", "seq": HANDOFF_SEQ_BASE, "name": "a"}]},
            "`commands[0].seq` is in the range the engine reserves",
        ),
        (
            {"commands": [{"kind": "sleep", "seq": 0, "ms": -1}]},
            "`commands[0].ms` must be a non-negative number",
        ),
        (
            {"commands": [{"kind": "sleep", "seq": 0, "ms": "5"}]},
            "`commands[0].ms` must be a non-negative number",
        ),
        (
            {"commands": [{"kind": "waitSignal", "seq": 0}]},
            "`commands[0].signal` must be a non-empty string",
        ),
        (
            {"commands": [{"kind": "startChild", "seq": 1, "workflow": 3}]},
            "`commands[0].workflow` must be a non-empty string",
        ),
        (
            {"commands": [{"kind": "recordStep", "seq": 0, "name": "n", "error": {"message": 1}}]},
            "`commands[0].error.message` must be a string",
        ),
        (
            {"commands": [{"kind": "recordStep", "seq": 0, "name": "n", "events": {}}]},
            "`commands[0].events` must be a list of objects",
        ),
        (
            {"commands": [{"kind": "recordStep", "seq": 0, "name": "n", "startedAt": "now"}]},
            "`commands[0].startedAt` must be a non-negative integer",
        ),
        ({"error": "boom"}, "`error` must be an object"),
    ],
)
def test_a_malformed_decision_names_its_task_and_the_key(
    change: dict[str, Any], problem: str
) -> None:
    with pytest.raises(WireFormatError) as caught:
        parse_workflow_decision({**GOOD, **change})
    message = str(caught.value)
    assert problem in message
    assert message.startswith("malformed workflow decision")
    ident = change.get("taskId", GOOD["taskId"])
    if isinstance(ident, str):
        assert repr(ident) in message


def test_an_unknown_command_kind_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedCommandError) as caught:
        parse_workflow_decision(
            {
                **GOOD,
                "commands": [
                    {"kind": "sleep", "seq": 0, "ms": 1},
                    {"kind": "upsertSearchAttributes", "seq": 1},
                ],
            }
        )
    assert str(caught.value) == (
        "workflow decision 'r:wf:0123abcd': remote workflow command 'upsertSearchAttributes' "
        "is not supported"
    )
    assert caught.value.command_kind == "upsertSearchAttributes"
    assert isinstance(caught.value, WireFormatError)  # dropped like any malformed decision


@pytest.mark.parametrize("raw", ["{not json", b"[1, 2]", 5, None])
def test_anything_but_a_json_object_is_refused(raw: object) -> None:
    for parse in (
        parse_workflow_decision,
        parse_workflow_task,
        parse_workflow_step_event,
        parse_run_heartbeat,
    ):
        with pytest.raises(WireFormatError):
            parse(raw)


def test_a_task_without_a_history_list_is_not_a_turn() -> None:
    task = WorkflowTask("r:wf:1", "r", "w", "1", None, (), "w").to_json()
    del task["history"]
    with pytest.raises(WireFormatError, match="`history` must be a list"):
        parse_workflow_task(task)
    with pytest.raises(WireFormatError, match=r"`history\[0\].kind` must be one of"):
        parse_workflow_task({**task, "history": [{"seq": 0, "kind": "sleep"}]})


def test_step_events_in_the_sdks_shape() -> None:
    running = {"runId": "r", "seq": 2, "name": "now#2", "phase": "running", "startedAt": 5}
    assert parse_workflow_step_event(running) == WorkflowStepEvent(
        run_id="r", seq=2, name="now#2", phase="running", started_at=5
    )
    done = {
        **running,
        "phase": "completed",
        "finishedAt": 9,
        "output": 77,
        "events": [],
        "parallelGroup": "gather:2",
    }
    event = parse_workflow_step_event(done)
    assert (event.output, event.events, event.parallel_group) == (77, (), "gather:2")
    assert event.to_json() == done
    with pytest.raises(WireFormatError, match="a failed step event needs `error`"):
        parse_workflow_step_event({**running, "phase": "failed"})
    with pytest.raises(WireFormatError, match=r"workflow step event 'r:2'.*`phase` must be"):
        parse_workflow_step_event({**running, "phase": "paused"})


def test_run_heartbeats_with_and_without_a_step() -> None:
    beat = parse_run_heartbeat('{"runId": "r", "seq": 0, "group": "orders"}')
    assert beat == RunHeartbeat(run_id="r", seq=0, group="orders")
    assert beat.to_json() == {"runId": "r", "seq": 0, "group": "orders"}
    step = parse_run_heartbeat({"runId": "r", "seq": 3, "group": "g", "stepId": "r:3"})
    assert step.step_id == "r:3"
    with pytest.raises(WireFormatError, match="run heartbeat 'r': `group` must be"):
        parse_run_heartbeat({"runId": "r", "seq": 0})
