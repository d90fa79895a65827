"""The JSON form of every data object, pinned.

These shapes are persisted (stored rows, onError handler input) and cross the HTTP API and
the CLI, so a change to how any object is written or read is a compatibility break. Each case
pins the exact text `json.dumps(obj.to_json())` produces (key order included: the run-detail
ETag and the console read these bytes), that `from_json` reads it back to an equal object, and
what `from_json` makes of the loose inputs it has always accepted (missing optional keys,
`null`s, epoch-millisecond dates).
"""

# ruff: noqa: E501  (the pinned JSON texts are kept on one line each)
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from durably import (
    AttemptError,
    BufferedSignalInfo,
    EngineEvent,
    FanPage,
    FanSummary,
    GroupHealth,
    MetricsSnapshot,
    RunDetail,
    RunFacetRow,
    RunResult,
    RunValueAxis,
    RunValueFacetOptions,
    RunValueFacetRow,
    RunWaiting,
    SignalWaiter,
    StepCheckpoint,
    StepError,
    StepEvent,
    WorkflowRun,
)
from durably._core.aggregates import CheckpointQuery, CheckpointStat
from durably._read.list_models import (
    LeaseOwnerRow,
    RunListItem,
    WorkerConcurrency,
    WorkerHeartbeat,
    WorkerStatus,
)
from durably._read.models import FanPageQuery, RunDetailOptions
from durably._read.vocabulary import FoldedFailure

# One instant with sub-millisecond digits (the two date forms differ there) and one without.
T1 = datetime(2026, 3, 4, 5, 6, 7, 891234, tzinfo=UTC)
T2 = datetime(2026, 3, 4, 5, 6, 9, tzinfo=UTC)
# The read side writes milliseconds: its own dates round-trip at that precision.
T3 = datetime(2026, 3, 4, 5, 6, 8, 123000, tzinfo=UTC)

ERR_FULL = StepError(
    message="boom", code="E_X", details={"a": [1, 2]}, retryable=False, stack="Traceback"
)
ERR_MIN = StepError(message="bare")
EVENT_FULL = StepEvent(
    at=1_700_000_000_123,
    level="warn",
    message="half",
    sub_id="s1",
    name="sub",
    group="g",
    status="completed",
    phase="end",
    data={"k": 1},
)
EVENT_MIN = StepEvent(at=5, level="info", message="hi")

RUN_MIN = WorkflowRun(
    id="r1", workflow="wf", workflow_version="1", status="pending", created_at=T2, updated_at=T2
)
RUN_FULL = WorkflowRun(
    id="r2",
    workflow="wf",
    workflow_version="7",
    status="failed",
    created_at=T1,
    updated_at=T2,
    input={"x": 1},
    output=[1, "two"],
    error=ERR_FULL,
    wake_at=1_700_000_000_000,
    locked_by="w-1",
    locked_until=1_700_000_030_000,
    recovery_attempts=2,
    tags=("a", "b"),
    search_attributes={"tier": "gold", "n": 3, "ok": True, "f": 1.5},
    namespace="ns",
    origin="api",
    priority=4,
    awaiting_decision_task_id="task-1",
)
RUN_FALSY = WorkflowRun(
    id="r3",
    workflow="wf",
    workflow_version="1",
    status="completed",
    created_at=T1,
    updated_at=T1,
    input=0,
    output=False,
    tags=(),
    search_attributes={},
    namespace=None,
    priority=0,
)

CP_MIN = StepCheckpoint(
    run_id="r1",
    seq=0,
    name="inc",
    kind="local",
    step_id="r1:0",
    status="completed",
    started_at=T1,
    finished_at=T2,
    enqueued_at=T1,
)
CP_FULL = StepCheckpoint(
    run_id="r2",
    seq=3,
    name="charge",
    kind="remote",
    step_id="custom-id",
    status="failed",
    started_at=T1,
    finished_at=T2,
    attempts=3,
    input={"amount": 5},
    output=None,
    error=ERR_MIN,
    worker_group="billing",
    events=(EVENT_FULL, EVENT_MIN),
    wake_at=1_700_000_000_500,
    parallel_group="all:3:2:ff",
    enqueued_at=T2,
)
CP_ATTEMPTS = dataclasses.replace(
    CP_MIN,
    attempts=3,
    attempt_errors=(
        AttemptError(attempt=1, at=1_700_000_000_100, message="down"),
        AttemptError(attempt=2, at=1_700_000_000_200, message="no", code="E", retryable=False),
    ),
    attempt_errors_omitted=4,
)
FAN = FanSummary(
    group="all:1:3",
    label="charge",
    first_seq=1,
    last_seq=3,
    size=3,
    fail_fast=True,
    counts={"completed": 2, "failed": 1},
    failures=(CP_FULL,),
    total=3,
    not_started=0,
    started_at=T3,
    finished_at=T2,
)
FAN_MIN = FanSummary(group="all:4:2", label="", first_seq=4, last_seq=5, size=2, fail_fast=False)
WORKER_STATUS = WorkerStatus(
    concurrency=WorkerConcurrency(mode="adaptive", limit=8, min=1, max=16),
    in_flight=2,
    runtime="python",
    rss_bytes=1000,
    rss_limit_bytes=2000,
    rss_pct=50.0,
    cpu_pct=12.5,
    throughput_per_min=60.0,
    p95_ms=3.25,
    last_adjust={"at": 1, "reason": "slow"},
)
HEARTBEAT = WorkerHeartbeat(group="g", instance_id="i-1", last_beat_at=1234, status=WORKER_STATUS)

# (case id, instance, whether its class reads its JSON back with from_json)
CASES: list[tuple[str, Any, bool]] = [
    ("step_error_full", ERR_FULL, True),
    ("step_error_min", ERR_MIN, True),
    ("step_event_full", EVENT_FULL, True),
    ("step_event_min", EVENT_MIN, True),
    ("run_min", RUN_MIN, True),
    ("run_full", RUN_FULL, True),
    ("run_falsy_values", RUN_FALSY, False),  # namespace None reads back as "default"
    ("checkpoint_min", CP_MIN, True),
    ("checkpoint_full", CP_FULL, True),
    ("checkpoint_attempts", CP_ATTEMPTS, True),
    ("signal_waiter_min", SignalWaiter(token="t", run_id="r1", seq=2), True),
    (
        "signal_waiter_full",
        SignalWaiter(token="t", run_id="r1", seq=2, parallel_group="all:2:3"),
        True,
    ),
    ("run_result_min", RunResult(run_id="r1", status="running"), True),
    (
        "run_result_full",
        RunResult(run_id="r1", status="failed", output={"o": 1}, error=ERR_FULL),
        True,
    ),
    ("detail_options_min", RunDetailOptions(), True),
    ("detail_options_full", RunDetailOptions(summarize_fans_over=100, if_none_match='W/"x"'), True),
    ("fan_summary_full", FAN, True),
    ("fan_summary_min", FAN_MIN, True),
    ("run_detail_min", RunDetail(run=RUN_MIN), True),
    (
        "run_detail_full",
        RunDetail(
            run=RUN_FULL,
            timeline=(CP_MIN, CP_FULL),
            children=("c1", "c2"),
            fans=(FAN, FAN_MIN),
            child_count=2,
            etag='W/"rd-1"',
            not_modified=True,
        ),
        True,
    ),
    ("run_detail_no_fans", RunDetail(run=RUN_MIN, fans=(), child_count=0), True),
    ("fan_page_query_min", FanPageQuery(), True),
    (
        "fan_page_query_full",
        FanPageQuery(offset=10, limit=2.5, failed_only=True, if_none_match='W/"p"'),
        True,
    ),
    ("fan_page_min", FanPage(), True),
    (
        "fan_page_full",
        FanPage(items=(CP_MIN,), total=9, etag='W/"fp"', not_modified=True),
        True,
    ),
    (
        "buffered_signal_min",
        BufferedSignalInfo(token="t", size_bytes=0, buffered_at=None, expires_at=None),
        True,
    ),
    (
        "buffered_signal_full",
        BufferedSignalInfo(token="t", size_bytes=12, buffered_at=T3, expires_at=T2),
        True,
    ),
    (
        "buffered_signal_sub_millisecond",
        BufferedSignalInfo(token="t", size_bytes=1, buffered_at=T1, expires_at=None),
        False,  # written at millisecond precision
    ),
    ("engine_event_min", EngineEvent(type="run.started", run_id="r1", at=T2), True),
    (
        "engine_event_full",
        EngineEvent(
            type="step.failed",
            run_id="r1",
            workflow="wf",
            namespace="ns",
            seq=4,
            name="inc",
            kind="local",
            output={"o": 2},
            error=ERR_MIN,
            duration_ms=1.5,
            queue_ms=0.25,
            attempt=2,
            at=T1,
        ),
        True,
    ),
    (
        "metrics_snapshot",
        MetricsSnapshot(
            runs={"started": 2, "completed": 1},
            routed_by_code={"E_X": 1},
            steps={"started": 5, "completed": 4, "failed": 1},
            by_workflow={"wf": {"started": 2, "completed": 1, "failed": 0}},
            step_duration={"sum_ms": 12.5, "count": 4.0},
        ),
        True,
    ),
    ("run_waiting", RunWaiting(on="signal", name="approve"), True),
    ("run_list_item_min", RunListItem(run=RUN_MIN), True),
    (
        "run_list_item_full",
        RunListItem(run=RUN_FULL, waiting=RunWaiting(on="child", name="c1")),
        True,
    ),
    ("run_facet_row_null_origin", RunFacetRow(status="running", origin=None, count=3), True),
    ("run_facet_row", RunFacetRow(status="failed", origin="api", count=1), True),
    ("run_value_axis", RunValueAxis(field="tag"), True),
    ("run_value_axis_attribute", RunValueAxis(field="attributeValue", key="tier"), True),
    ("run_value_facet_options_min", RunValueFacetOptions(), True),
    ("run_value_facet_options_full", RunValueFacetOptions(limit=10, scan=50), True),
    ("run_value_facet_row_null", RunValueFacetRow(value=None, count=2), True),
    ("run_value_facet_row", RunValueFacetRow(value="gold", count=5), True),
    ("worker_concurrency_min", WorkerConcurrency(mode="fixed", limit=4), True),
    (
        "worker_status_min",
        WorkerStatus(concurrency=WorkerConcurrency("fixed", 1), in_flight=0),
        True,
    ),
    ("worker_status_full", WORKER_STATUS, True),
    ("worker_heartbeat_min", WorkerHeartbeat(group="g", instance_id="i", last_beat_at=1), True),
    ("worker_heartbeat_full", HEARTBEAT, True),
    ("group_health_min", GroupHealth(group="g", depth=0), True),
    (
        "group_health_full",
        GroupHealth(group="g", depth=3, live_workers=(HEARTBEAT,), kind="step"),
        True,
    ),
    ("lease_owner_row", LeaseOwnerRow(namespace="ns", owner="w-1", runs=2, lease_until=99), False),
    (
        "checkpoint_stat",
        CheckpointStat(
            group="all:1:2",
            status="completed",
            name_kind="step",
            count=2,
            min_seq=1,
            max_seq=2,
            min_name="a",
            max_name="b",
            min_enqueued_at=T1,
            min_started_at=T1,
            max_started_at=T2,
            max_finished_at=T2,
            sum_attempts=3,
        ),
        True,
    ),
    ("checkpoint_query_min", CheckpointQuery(), True),
    (
        "checkpoint_query_full",
        CheckpointQuery(
            group="all:1:2",
            exclude_groups=("x",),
            statuses=("failed",),
            name_prefixes=("fan:",),
            offset=1,
            limit=2,
        ),
        True,
    ),
    (
        "checkpoint_stat_ungrouped",
        CheckpointStat(
            group=None,
            status="failed",
            name_kind="child",
            count=1,
            min_seq=4,
            max_seq=4,
            min_name="signal:child:c",
            max_name="signal:child:c",
            min_enqueued_at=T2,
            min_started_at=T2,
            max_started_at=T2,
            max_finished_at=T2,
            sum_attempts=1,
        ),
        True,
    ),
    ("folded_failure_min", FoldedFailure(id="p.1"), False),
    ("folded_failure_full", FoldedFailure(id="p.2", error="boom", code="E", details=[1]), False),
]

PINNED: dict[str, str] = {
    "step_error_full": '{"message": "boom", "code": "E_X", "details": {"a": [1, 2]}, "retryable": false, "stack": "Traceback"}',
    "step_error_min": '{"message": "bare"}',
    "step_event_full": '{"at": 1700000000123, "level": "warn", "message": "half", "subId": "s1", "name": "sub", "group": "g", "status": "completed", "phase": "end", "data": {"k": 1}}',
    "step_event_min": '{"at": 5, "level": "info", "message": "hi"}',
    "run_min": '{"id": "r1", "workflow": "wf", "workflowVersion": "1", "status": "pending", "namespace": "default", "createdAt": "2026-03-04T05:06:09Z", "updatedAt": "2026-03-04T05:06:09Z"}',
    "run_full": '{"id": "r2", "workflow": "wf", "workflowVersion": "7", "status": "failed", "input": {"x": 1}, "output": [1, "two"], "error": {"message": "boom", "code": "E_X", "details": {"a": [1, 2]}, "retryable": false, "stack": "Traceback"}, "wakeAt": 1700000000000, "lockedBy": "w-1", "lockedUntil": 1700000030000, "recoveryAttempts": 2, "tags": ["a", "b"], "searchAttributes": {"tier": "gold", "n": 3, "ok": true, "f": 1.5}, "namespace": "ns", "origin": "api", "priority": 4, "awaitingDecisionTaskId": "task-1", "createdAt": "2026-03-04T05:06:07.891234Z", "updatedAt": "2026-03-04T05:06:09Z"}',
    "run_falsy_values": '{"id": "r3", "workflow": "wf", "workflowVersion": "1", "status": "completed", "input": 0, "output": false, "tags": [], "searchAttributes": {}, "priority": 0, "createdAt": "2026-03-04T05:06:07.891234Z", "updatedAt": "2026-03-04T05:06:07.891234Z"}',
    "checkpoint_min": '{"runId": "r1", "seq": 0, "name": "inc", "kind": "local", "stepId": "r1:0", "status": "completed", "attempts": 1, "enqueuedAt": "2026-03-04T05:06:07.891234Z", "startedAt": "2026-03-04T05:06:07.891234Z", "finishedAt": "2026-03-04T05:06:09Z"}',
    "checkpoint_attempts": '{"runId": "r1", "seq": 0, "name": "inc", "kind": "local", "stepId": "r1:0", "status": "completed", "attempts": 3, "attemptErrors": [{"attempt": 1, "at": 1700000000100, "message": "down"}, {"attempt": 2, "at": 1700000000200, "message": "no", "code": "E", "retryable": false}], "attemptErrorsOmitted": 4, "enqueuedAt": "2026-03-04T05:06:07.891234Z", "startedAt": "2026-03-04T05:06:07.891234Z", "finishedAt": "2026-03-04T05:06:09Z"}',
    "checkpoint_full": '{"runId": "r2", "seq": 3, "name": "charge", "kind": "remote", "stepId": "custom-id", "status": "failed", "input": {"amount": 5}, "error": {"message": "bare"}, "attempts": 3, "workerGroup": "billing", "events": [{"at": 1700000000123, "level": "warn", "message": "half", "subId": "s1", "name": "sub", "group": "g", "status": "completed", "phase": "end", "data": {"k": 1}}, {"at": 5, "level": "info", "message": "hi"}], "wakeAt": 1700000000500, "parallelGroup": "all:3:2:ff", "enqueuedAt": "2026-03-04T05:06:09Z", "startedAt": "2026-03-04T05:06:07.891234Z", "finishedAt": "2026-03-04T05:06:09Z"}',
    "signal_waiter_min": '{"token": "t", "runId": "r1", "seq": 2}',
    "signal_waiter_full": '{"token": "t", "runId": "r1", "seq": 2, "parallelGroup": "all:2:3"}',
    "run_result_min": '{"runId": "r1", "status": "running"}',
    "run_result_full": '{"runId": "r1", "status": "failed", "output": {"o": 1}, "error": {"message": "boom", "code": "E_X", "details": {"a": [1, 2]}, "retryable": false, "stack": "Traceback"}}',
    "detail_options_min": "{}",
    "detail_options_full": '{"summarizeFansOver": 100, "ifNoneMatch": "W/\\"x\\""}',
    "fan_summary_full": '{"group": "all:1:3", "label": "charge", "firstSeq": 1, "lastSeq": 3, "size": 3, "total": 3, "notStarted": 0, "failFast": true, "counts": {"completed": 2, "failed": 1}, "startedAt": "2026-03-04T05:06:08.123Z", "finishedAt": "2026-03-04T05:06:09.000Z", "failures": [{"runId": "r2", "seq": 3, "name": "charge", "kind": "remote", "stepId": "custom-id", "status": "failed", "input": {"amount": 5}, "error": {"message": "bare"}, "attempts": 3, "workerGroup": "billing", "events": [{"at": 1700000000123, "level": "warn", "message": "half", "subId": "s1", "name": "sub", "group": "g", "status": "completed", "phase": "end", "data": {"k": 1}}, {"at": 5, "level": "info", "message": "hi"}], "wakeAt": 1700000000500, "parallelGroup": "all:3:2:ff", "enqueuedAt": "2026-03-04T05:06:09Z", "startedAt": "2026-03-04T05:06:07.891234Z", "finishedAt": "2026-03-04T05:06:09Z"}]}',
    "fan_summary_min": '{"group": "all:4:2", "label": "", "firstSeq": 4, "lastSeq": 5, "size": 2, "failFast": false, "counts": {}, "failures": []}',
    "run_detail_min": '{"run": {"id": "r1", "workflow": "wf", "workflowVersion": "1", "status": "pending", "namespace": "default", "createdAt": "2026-03-04T05:06:09Z", "updatedAt": "2026-03-04T05:06:09Z"}, "timeline": [], "children": []}',
    "run_detail_full": '{"run": {"id": "r2", "workflow": "wf", "workflowVersion": "7", "status": "failed", "input": {"x": 1}, "output": [1, "two"], "error": {"message": "boom", "code": "E_X", "details": {"a": [1, 2]}, "retryable": false, "stack": "Traceback"}, "wakeAt": 1700000000000, "lockedBy": "w-1", "lockedUntil": 1700000030000, "recoveryAttempts": 2, "tags": ["a", "b"], "searchAttributes": {"tier": "gold", "n": 3, "ok": true, "f": 1.5}, "namespace": "ns", "origin": "api", "priority": 4, "awaitingDecisionTaskId": "task-1", "createdAt": "2026-03-04T05:06:07.891234Z", "updatedAt": "2026-03-04T05:06:09Z"}, "timeline": [{"runId": "r1", "seq": 0, "name": "inc", "kind": "local", "stepId": "r1:0", "status": "completed", "attempts": 1, "enqueuedAt": "2026-03-04T05:06:07.891234Z", "startedAt": "2026-03-04T05:06:07.891234Z", "finishedAt": "2026-03-04T05:06:09Z"}, {"runId": "r2", "seq": 3, "name": "charge", "kind": "remote", "stepId": "custom-id", "status": "failed", "input": {"amount": 5}, "error": {"message": "bare"}, "attempts": 3, "workerGroup": "billing", "events": [{"at": 1700000000123, "level": "warn", "message": "half", "subId": "s1", "name": "sub", "group": "g", "status": "completed", "phase": "end", "data": {"k": 1}}, {"at": 5, "level": "info", "message": "hi"}], "wakeAt": 1700000000500, "parallelGroup": "all:3:2:ff", "enqueuedAt": "2026-03-04T05:06:09Z", "startedAt": "2026-03-04T05:06:07.891234Z", "finishedAt": "2026-03-04T05:06:09Z"}], "children": ["c1", "c2"], "fans": [{"group": "all:1:3", "label": "charge", "firstSeq": 1, "lastSeq": 3, "size": 3, "total": 3, "notStarted": 0, "failFast": true, "counts": {"completed": 2, "failed": 1}, "startedAt": "2026-03-04T05:06:08.123Z", "finishedAt": "2026-03-04T05:06:09.000Z", "failures": [{"runId": "r2", "seq": 3, "name": "charge", "kind": "remote", "stepId": "custom-id", "status": "failed", "input": {"amount": 5}, "error": {"message": "bare"}, "attempts": 3, "workerGroup": "billing", "events": [{"at": 1700000000123, "level": "warn", "message": "half", "subId": "s1", "name": "sub", "group": "g", "status": "completed", "phase": "end", "data": {"k": 1}}, {"at": 5, "level": "info", "message": "hi"}], "wakeAt": 1700000000500, "parallelGroup": "all:3:2:ff", "enqueuedAt": "2026-03-04T05:06:09Z", "startedAt": "2026-03-04T05:06:07.891234Z", "finishedAt": "2026-03-04T05:06:09Z"}]}, {"group": "all:4:2", "label": "", "firstSeq": 4, "lastSeq": 5, "size": 2, "failFast": false, "counts": {}, "failures": []}], "childCount": 2, "etag": "W/\\"rd-1\\"", "notModified": true}',
    "run_detail_no_fans": '{"run": {"id": "r1", "workflow": "wf", "workflowVersion": "1", "status": "pending", "namespace": "default", "createdAt": "2026-03-04T05:06:09Z", "updatedAt": "2026-03-04T05:06:09Z"}, "timeline": [], "children": [], "fans": [], "childCount": 0}',
    "fan_page_query_min": "{}",
    "fan_page_query_full": '{"offset": 10, "limit": 2.5, "failedOnly": true, "ifNoneMatch": "W/\\"p\\""}',
    "fan_page_min": '{"items": [], "total": 0}',
    "fan_page_full": '{"items": [{"runId": "r1", "seq": 0, "name": "inc", "kind": "local", "stepId": "r1:0", "status": "completed", "attempts": 1, "enqueuedAt": "2026-03-04T05:06:07.891234Z", "startedAt": "2026-03-04T05:06:07.891234Z", "finishedAt": "2026-03-04T05:06:09Z"}], "total": 9, "etag": "W/\\"fp\\"", "notModified": true}',
    "buffered_signal_min": '{"token": "t", "sizeBytes": 0}',
    "buffered_signal_full": '{"token": "t", "sizeBytes": 12, "bufferedAt": "2026-03-04T05:06:08.123Z", "expiresAt": "2026-03-04T05:06:09.000Z"}',
    "buffered_signal_sub_millisecond": '{"token": "t", "sizeBytes": 1, "bufferedAt": "2026-03-04T05:06:07.891Z"}',
    "engine_event_min": '{"type": "run.started", "runId": "r1", "at": "2026-03-04T05:06:09Z"}',
    "engine_event_full": '{"type": "step.failed", "runId": "r1", "workflow": "wf", "namespace": "ns", "seq": 4, "name": "inc", "kind": "local", "output": {"o": 2}, "error": {"message": "bare"}, "durationMs": 1.5, "queueMs": 0.25, "attempt": 2, "at": "2026-03-04T05:06:07.891234Z"}',
    "metrics_snapshot": '{"runs": {"started": 2, "completed": 1}, "routedByCode": {"E_X": 1}, "steps": {"started": 5, "completed": 4, "failed": 1}, "byWorkflow": {"wf": {"started": 2, "completed": 1, "failed": 0}}, "stepDuration": {"sumMs": 12.5, "count": 4.0}}',
    "run_waiting": '{"on": "signal", "name": "approve"}',
    "run_list_item_min": '{"id": "r1", "workflow": "wf", "workflowVersion": "1", "status": "pending", "namespace": "default", "createdAt": "2026-03-04T05:06:09Z", "updatedAt": "2026-03-04T05:06:09Z"}',
    "run_list_item_full": '{"id": "r2", "workflow": "wf", "workflowVersion": "7", "status": "failed", "input": {"x": 1}, "output": [1, "two"], "error": {"message": "boom", "code": "E_X", "details": {"a": [1, 2]}, "retryable": false, "stack": "Traceback"}, "wakeAt": 1700000000000, "lockedBy": "w-1", "lockedUntil": 1700000030000, "recoveryAttempts": 2, "tags": ["a", "b"], "searchAttributes": {"tier": "gold", "n": 3, "ok": true, "f": 1.5}, "namespace": "ns", "origin": "api", "priority": 4, "awaitingDecisionTaskId": "task-1", "createdAt": "2026-03-04T05:06:07.891234Z", "updatedAt": "2026-03-04T05:06:09Z", "waiting": {"on": "child", "name": "c1"}}',
    "run_facet_row_null_origin": '{"status": "running", "origin": null, "count": 3}',
    "run_facet_row": '{"status": "failed", "origin": "api", "count": 1}',
    "run_value_axis": '{"field": "tag"}',
    "run_value_axis_attribute": '{"field": "attributeValue", "key": "tier"}',
    "run_value_facet_options_min": "{}",
    "run_value_facet_options_full": '{"limit": 10, "scan": 50}',
    "run_value_facet_row_null": '{"value": null, "count": 2}',
    "run_value_facet_row": '{"value": "gold", "count": 5}',
    "worker_concurrency_min": '{"mode": "fixed", "limit": 4}',
    "worker_status_min": '{"concurrency": {"mode": "fixed", "limit": 1}, "inFlight": 0}',
    "worker_status_full": '{"runtime": "python", "concurrency": {"mode": "adaptive", "limit": 8, "min": 1, "max": 16}, "inFlight": 2, "rssBytes": 1000, "rssLimitBytes": 2000, "rssPct": 50.0, "cpuPct": 12.5, "throughputPerMin": 60.0, "p95Ms": 3.25, "lastAdjust": {"at": 1, "reason": "slow"}}',
    "worker_heartbeat_min": '{"group": "g", "instanceId": "i", "lastBeatAt": 1}',
    "worker_heartbeat_full": '{"group": "g", "instanceId": "i-1", "lastBeatAt": 1234, "status": {"runtime": "python", "concurrency": {"mode": "adaptive", "limit": 8, "min": 1, "max": 16}, "inFlight": 2, "rssBytes": 1000, "rssLimitBytes": 2000, "rssPct": 50.0, "cpuPct": 12.5, "throughputPerMin": 60.0, "p95Ms": 3.25, "lastAdjust": {"at": 1, "reason": "slow"}}}',
    "group_health_min": '{"group": "g", "depth": 0, "liveWorkers": []}',
    "group_health_full": '{"group": "g", "depth": 3, "liveWorkers": [{"group": "g", "instanceId": "i-1", "lastBeatAt": 1234, "status": {"runtime": "python", "concurrency": {"mode": "adaptive", "limit": 8, "min": 1, "max": 16}, "inFlight": 2, "rssBytes": 1000, "rssLimitBytes": 2000, "rssPct": 50.0, "cpuPct": 12.5, "throughputPerMin": 60.0, "p95Ms": 3.25, "lastAdjust": {"at": 1, "reason": "slow"}}}], "kind": "step"}',
    "lease_owner_row": '{"namespace": "ns", "owner": "w-1", "runs": 2, "leaseUntil": 99}',
    "checkpoint_stat": '{"group": "all:1:2", "status": "completed", "nameKind": "step", "count": 2, "minSeq": 1, "maxSeq": 2, "minName": "a", "maxName": "b", "minEnqueuedAt": "2026-03-04T05:06:07.891234Z", "minStartedAt": "2026-03-04T05:06:07.891234Z", "maxStartedAt": "2026-03-04T05:06:09Z", "maxFinishedAt": "2026-03-04T05:06:09Z", "sumAttempts": 3}',
    "checkpoint_query_min": "{}",
    "checkpoint_query_full": '{"group": "all:1:2", "excludeGroups": ["x"], "statuses": ["failed"], "namePrefixes": ["fan:"], "offset": 1, "limit": 2}',
    "checkpoint_stat_ungrouped": '{"group": null, "status": "failed", "nameKind": "child", "count": 1, "minSeq": 4, "maxSeq": 4, "minName": "signal:child:c", "maxName": "signal:child:c", "minEnqueuedAt": "2026-03-04T05:06:09Z", "minStartedAt": "2026-03-04T05:06:09Z", "maxStartedAt": "2026-03-04T05:06:09Z", "maxFinishedAt": "2026-03-04T05:06:09Z", "sumAttempts": 1}',
    "folded_failure_min": '{"id": "p.1", "error": null}',
    "folded_failure_full": '{"id": "p.2", "error": "boom", "code": "E", "details": [1]}',
}

# (case id, reader, loose JSON input): what `from_json` has always made of it, as repr.
LOOSE: list[tuple[str, Callable[[Any], Any], dict[str, Any]]] = [
    (
        "step_error_nulls_and_wrong_types",
        StepError.from_json,
        {"message": "m", "code": None, "retryable": "yes", "stack": 5, "details": None},
    ),
    ("step_error_empty", StepError.from_json, {}),
    ("step_event_empty", StepEvent.from_json, {}),
    (
        "run_defaults_and_epoch_ms",
        WorkflowRun.from_json,
        {
            "id": 1,
            "workflow": "wf",
            "status": "running",
            "createdAt": 1_700_000_000_123,
            "updatedAt": "2026-03-04T05:06:07Z",
        },
    ),
    (
        "run_empty_namespace_and_odd_error",
        WorkflowRun.from_json,
        {
            "id": "r",
            "workflow": "wf",
            "workflowVersion": "",
            "status": "running",
            "namespace": "",
            "error": "not an object",
            "tags": ["x"],
            "createdAt": "2026-03-04T05:06:07.5+00:00",
            "updatedAt": "2026-03-04T05:06:07",
        },
    ),
    (
        "checkpoint_defaults",
        StepCheckpoint.from_json,
        {
            "runId": "r",
            "seq": "2",
            "name": "n",
            "kind": "local",
            "status": "completed",
            "startedAt": "2026-03-04T05:06:07.891234Z",
            "finishedAt": 1_700_000_000_000,
            "events": [],
            "stepId": "",
        },
    ),
    (
        "checkpoint_error_and_events",
        StepCheckpoint.from_json,
        {
            "runId": "r",
            "seq": 1,
            "name": "n",
            "kind": "sleep",
            "status": "failed",
            "error": {"message": "x", "code": 3},
            "events": [{"at": 1, "level": "info", "message": "m", "extra": 1}],
            "attempts": 2,
            "startedAt": "2026-03-04T05:06:07Z",
            "finishedAt": "2026-03-04T05:06:08Z",
            "enqueuedAt": "2026-03-04T05:06:06Z",
        },
    ),
    (
        "fan_summary_loose",
        FanSummary.from_json,
        {
            "group": "all:1:2",
            "firstSeq": 1,
            "lastSeq": "2",
            "total": "3",
            "notStarted": 1.0,
            "counts": ["x"],
            "failures": None,
            "startedAt": 1_700_000_000_000,
        },
    ),
    (
        "fan_summary_counts",
        FanSummary.from_json,
        {
            "group": "g",
            "label": "l",
            "firstSeq": 0,
            "lastSeq": 0,
            "size": 1,
            "failFast": True,
            "counts": {"failed": "2"},
        },
    ),
    (
        "run_detail_loose",
        RunDetail.from_json,
        {
            "run": {
                "id": "r",
                "workflow": "wf",
                "status": "running",
                "createdAt": "2026-03-04T05:06:07Z",
                "updatedAt": "2026-03-04T05:06:07Z",
            },
            "fans": {"not": "a list"},
            "childCount": 2.0,
            "etag": 5,
            "notModified": "yes",
            "children": [1, 2],
            "timeline": None,
        },
    ),
    (
        "detail_options_loose",
        RunDetailOptions.from_json,
        {"summarizeFansOver": True, "ifNoneMatch": 5},
    ),
    ("detail_options_float", RunDetailOptions.from_json, {"summarizeFansOver": 10.7}),
    (
        "fan_page_query_loose",
        FanPageQuery.from_json,
        {"offset": "abc", "limit": None, "failedOnly": 1, "ifNoneMatch": None},
    ),
    ("fan_page_empty", FanPage.from_json, {}),
    ("fan_page_loose", FanPage.from_json, {"total": "4", "etag": 1, "notModified": True}),
    ("buffered_signal_loose", BufferedSignalInfo.from_json, {"token": 5}),
    (
        "buffered_signal_offset_dates",
        BufferedSignalInfo.from_json,
        {"token": "t", "sizeBytes": "3", "bufferedAt": "2026-03-04T07:06:07+02:00"},
    ),
    ("run_waiting_coerced", RunWaiting.from_json, {"on": "signal", "name": 7}),
    ("worker_concurrency_empty", WorkerConcurrency.from_json, {}),
    ("worker_status_empty", WorkerStatus.from_json, {}),
    (
        "worker_status_loose",
        WorkerStatus.from_json,
        {"inFlight": "2", "runtime": "", "lastAdjust": {"at": 1}},
    ),
    ("group_health_loose", GroupHealth.from_json, {"group": 5, "kind": None}),
    (
        "worker_heartbeat_odd_status",
        WorkerHeartbeat.from_json,
        {"group": "g", "instanceId": "i", "lastBeatAt": "12", "status": []},
    ),
    (
        "run_facet_row_loose",
        RunFacetRow.from_json,
        {"status": "running", "origin": 5, "count": "2"},
    ),
    ("run_value_facet_row_loose", RunValueFacetRow.from_json, {"value": 3, "count": 1.0}),
    ("run_value_facet_options_loose", RunValueFacetOptions.from_json, {"limit": True, "scan": 9.5}),
]

LOOSE_PINNED: dict[str, str] = {
    "step_error_nulls_and_wrong_types": "StepError(message='m', code=None, details=None, retryable=None, stack=None)",
    "step_error_empty": "StepError(message='', code=None, details=None, retryable=None, stack=None)",
    "step_event_empty": "StepEvent(at=0, level='info', message='', sub_id=None, name=None, group=None, status=None, phase=None, data=None)",
    "run_defaults_and_epoch_ms": "WorkflowRun(id='1', workflow='wf', workflow_version='1', status='running', created_at=datetime.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=datetime.timezone.utc), updated_at=datetime.datetime(2026, 3, 4, 5, 6, 7, tzinfo=datetime.timezone.utc), input=None, output=None, error=None, wake_at=None, locked_by=None, locked_until=None, recovery_attempts=None, tags=None, search_attributes=None, namespace='default', origin=None, priority=None, awaiting_decision_task_id=None)",
    "run_empty_namespace_and_odd_error": "WorkflowRun(id='r', workflow='wf', workflow_version='', status='running', created_at=datetime.datetime(2026, 3, 4, 5, 6, 7, 500000, tzinfo=datetime.timezone.utc), updated_at=datetime.datetime(2026, 3, 4, 5, 6, 7, tzinfo=datetime.timezone.utc), input=None, output=None, error=None, wake_at=None, locked_by=None, locked_until=None, recovery_attempts=None, tags=('x',), search_attributes=None, namespace='default', origin=None, priority=None, awaiting_decision_task_id=None)",
    "checkpoint_defaults": "StepCheckpoint(run_id='r', seq=2, name='n', kind='local', step_id='r:2', status='completed', started_at=datetime.datetime(2026, 3, 4, 5, 6, 7, 891234, tzinfo=datetime.timezone.utc), finished_at=datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.timezone.utc), attempts=1, input=None, output=None, error=None, worker_group=None, events=None, wake_at=None, parallel_group=None, enqueued_at=datetime.datetime(2026, 3, 4, 5, 6, 7, 891234, tzinfo=datetime.timezone.utc), attempt_errors=None, attempt_errors_omitted=0)",
    "checkpoint_error_and_events": "StepCheckpoint(run_id='r', seq=1, name='n', kind='sleep', step_id='r:1', status='failed', started_at=datetime.datetime(2026, 3, 4, 5, 6, 7, tzinfo=datetime.timezone.utc), finished_at=datetime.datetime(2026, 3, 4, 5, 6, 8, tzinfo=datetime.timezone.utc), attempts=2, input=None, output=None, error=StepError(message='x', code=None, details=None, retryable=None, stack=None), worker_group=None, events=(StepEvent(at=1, level='info', message='m', sub_id=None, name=None, group=None, status=None, phase=None, data=None),), wake_at=None, parallel_group=None, enqueued_at=datetime.datetime(2026, 3, 4, 5, 6, 6, tzinfo=datetime.timezone.utc), attempt_errors=None, attempt_errors_omitted=0)",
    "fan_summary_loose": "FanSummary(group='all:1:2', label='', first_seq=1, last_seq=2, size=0, fail_fast=False, counts={}, failures=(), total=None, not_started=1, started_at=datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.timezone.utc), finished_at=None)",
    "fan_summary_counts": "FanSummary(group='g', label='l', first_seq=0, last_seq=0, size=1, fail_fast=True, counts={'failed': 2}, failures=(), total=None, not_started=None, started_at=None, finished_at=None)",
    "run_detail_loose": "RunDetail(run=WorkflowRun(id='r', workflow='wf', workflow_version='1', status='running', created_at=datetime.datetime(2026, 3, 4, 5, 6, 7, tzinfo=datetime.timezone.utc), updated_at=datetime.datetime(2026, 3, 4, 5, 6, 7, tzinfo=datetime.timezone.utc), input=None, output=None, error=None, wake_at=None, locked_by=None, locked_until=None, recovery_attempts=None, tags=None, search_attributes=None, namespace='default', origin=None, priority=None, awaiting_decision_task_id=None), timeline=(), children=('1', '2'), fans=None, child_count=2, etag=None, not_modified=False)",
    "detail_options_loose": "RunDetailOptions(summarize_fans_over=None, if_none_match=None)",
    "detail_options_float": "RunDetailOptions(summarize_fans_over=10, if_none_match=None)",
    "fan_page_query_loose": "FanPageQuery(offset='abc', limit=None, failed_only=False, if_none_match=None)",
    "fan_page_empty": "FanPage(items=(), total=0, etag=None, not_modified=False)",
    "fan_page_loose": "FanPage(items=(), total=4, etag=None, not_modified=True)",
    "buffered_signal_loose": "BufferedSignalInfo(token='5', size_bytes=0, buffered_at=None, expires_at=None)",
    "buffered_signal_offset_dates": "BufferedSignalInfo(token='t', size_bytes=3, buffered_at=datetime.datetime(2026, 3, 4, 7, 6, 7, tzinfo=datetime.timezone(datetime.timedelta(seconds=7200))), expires_at=None)",
    "run_waiting_coerced": "RunWaiting(on='signal', name='7', detail=None)",
    "worker_concurrency_empty": "WorkerConcurrency(mode='fixed', limit=0, min=None, max=None)",
    "worker_status_empty": "WorkerStatus(concurrency=WorkerConcurrency(mode='fixed', limit=0, min=None, max=None), in_flight=0, runtime=None, rss_bytes=None, rss_limit_bytes=None, rss_pct=None, cpu_pct=None, throughput_per_min=None, p95_ms=None, last_adjust=None)",
    "worker_status_loose": "WorkerStatus(concurrency=WorkerConcurrency(mode='fixed', limit=0, min=None, max=None), in_flight=2, runtime=None, rss_bytes=None, rss_limit_bytes=None, rss_pct=None, cpu_pct=None, throughput_per_min=None, p95_ms=None, last_adjust={'at': 1})",
    "group_health_loose": "GroupHealth(group='5', depth=0, live_workers=(), kind=None, transport=None)",
    "worker_heartbeat_odd_status": "WorkerHeartbeat(group='g', instance_id='i', last_beat_at=12, status=None, descriptor=None)",
    "run_facet_row_loose": "RunFacetRow(status='running', origin=None, count=2)",
    "run_value_facet_row_loose": "RunValueFacetRow(value=None, count=1)",
    "run_value_facet_options_loose": "RunValueFacetOptions(limit=None, scan=9)",
}


@pytest.mark.parametrize(("case", "obj", "reads_back"), CASES, ids=[c[0] for c in CASES])
def test_json_text_is_pinned_and_reads_back(case: str, obj: Any, reads_back: bool) -> None:
    text = json.dumps(obj.to_json())
    assert text == PINNED[case]
    if reads_back:
        again = type(obj).from_json(json.loads(text))
        assert again == obj
        assert json.dumps(again.to_json()) == text


@pytest.mark.parametrize(("case", "read", "data"), LOOSE, ids=[c[0] for c in LOOSE])
def test_loose_input_reads_as_before(case: str, read: Callable[[Any], Any], data: Any) -> None:
    assert repr(read(data)) == LOOSE_PINNED[case]


def test_every_case_is_pinned() -> None:
    assert sorted(PINNED) == sorted(c[0] for c in CASES)
    assert sorted(LOOSE_PINNED) == sorted(c[0] for c in LOOSE)


def test_a_missing_required_key_is_named() -> None:
    with pytest.raises(ValueError, match="WorkflowRun JSON: required key 'createdAt' is missing"):
        WorkflowRun.from_json({"id": "r", "workflow": "w", "status": "running"})
    with pytest.raises(ValueError, match="StepCheckpoint JSON: required key 'runId' is missing"):
        StepCheckpoint.from_json({"seq": 1})


def test_an_unusable_value_is_named() -> None:
    with pytest.raises(ValueError, match="StepCheckpoint JSON: key 'seq' has an unusable value"):
        StepCheckpoint.from_json({"runId": "r", "seq": "three"})
    with pytest.raises(ValueError, match="FanSummary JSON: key 'startedAt' has an unusable value"):
        FanSummary.from_json({"group": "g", "firstSeq": 0, "lastSeq": 0, "startedAt": "yesterday"})


def test_converters_are_built_once_per_class() -> None:
    StepCheckpoint.from_json(CP_FULL.to_json())
    # After the first use the class holds converters generated for it (no per-field loop
    # at call time), not the lazy builders it inherits.
    assert StepCheckpoint.to_json.__code__.co_filename == "<jsonshape StepCheckpoint>"
    assert StepCheckpoint.from_json.__code__.co_filename == "<jsonshape StepCheckpoint>"
