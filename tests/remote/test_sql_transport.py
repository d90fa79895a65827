"""The SQL transport on a real PostgreSQL: dispatch, durably's own step server, the result drain.

Each test has its own table prefix (see sql_support). Rows that a durable-worker process or a
crashed worker would leave are written with plain SQL, exactly as those would write them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import pytest

from durably import StepError
from durably._core.wire import RemoteTask, StepResult
from durably._transport.protocol import TransportFeatures
from durably.transports import SqlTransport, TransportUnavailableError
from tests.pg_support import connect
from tests.remote.sql_support import (
    RecordingSink,
    create_tables,
    db_fixture,  # noqa: F401
    eventually,
    insert_result,
    now_ms,
    prefix_fixture,  # noqa: F401
    rows,
    task,
    transport,
)

pytestmark = pytest.mark.timeout(60)


def completed(task: RemoteTask, output: Any) -> StepResult:
    return StepResult(task.run_id, task.seq, task.step_id, "completed", output, started_at=now_ms())


async def echo(task: RemoteTask) -> StepResult:
    return completed(task, {"echo": task.input, "attempt": task.attempt, "name": task.name})


async def test_a_step_goes_to_the_server_and_its_result_to_the_sink(prefix: str, db: Any) -> None:
    t = transport(prefix)
    sink = RecordingSink()
    seen: list[RemoteTask] = []

    async def double(task: RemoteTask) -> StepResult:
        seen.append(task)
        return completed(task, {"doubled": task.input["n"] * 2})

    await t.start(sink)
    server = await t.step_server(["math.double"], double, concurrency=2)
    try:
        await t.dispatch(task("run-1", 3, "math.double", {"n": 21}, priority=5, context={"a": 1}))
        [result] = await sink.wait_for(1)
        assert (result.run_id, result.seq, result.step_id) == ("run-1", 3, "run-1:3")
        assert (result.status, result.output, result.error) == ("completed", {"doubled": 42}, None)
        assert isinstance(result.started_at, int)
        # What reaches a worker is what the SDK builds from the row: no priority or context.
        assert seen == [task("run-1", 3, "math.double", {"n": 21})]

        async def empty() -> bool:
            return not await rows(db, prefix, "tasks") and not await rows(db, prefix, "results")

        await eventually(empty)
    finally:
        await server.drain(1)
        await t.close()


async def test_a_dispatched_task_row_is_what_the_sdk_reads(prefix: str, db: Any) -> None:
    t = transport(prefix)
    try:
        before = now_ms()
        await t.dispatch(task("run-2", 0, "payments.charge", None, group="payments.charge@acme"))
        await t.dispatch(task("run-2", 1, "payments.charge", {"amount": 5, "note": "é"}))
        first, second = await rows(db, prefix, "tasks")
        assert first | {"created_at": 0} == {
            "step_id": "run-2:0",
            "run_id": "run-2",
            "seq": 0,
            "name": "payments.charge",
            "grp": "payments.charge@acme",
            "input": "null",
            "attempt": 1,
            "status": "pending",
            "claimed_by": None,
            "claimed_at": None,
            "created_at": 0,
        }
        assert before <= first["created_at"] <= now_ms()
        assert second["input"] == '{"amount":5,"note":"é"}'
        index = await db.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE indexname = $1",
            f"{prefix}_transport_tasks_grp_idx",
        )
        assert index is not None and "(grp, status, created_at)" in index
    finally:
        await t.close()


async def test_features_say_steps_only() -> None:
    t = SqlTransport("postgresql://postgres@127.0.0.1:5432/test", prefix="unused")
    assert t.kind == "sql"
    assert t.features == TransportFeatures()
    assert t.turns is None
    await t.close()


async def test_a_duplicate_result_is_delivered_once_per_delivery_and_deleted_after(
    prefix: str, db: Any
) -> None:
    t = transport(prefix)
    inspector = await connect()
    during: list[list[str]] = []

    async def check(results: Sequence[StepResult]) -> None:
        found = await inspector.fetch(f'SELECT step_id FROM "{prefix}_transport_results"')
        during.append([row["step_id"] for row in found])

    sink = RecordingSink(check)
    try:
        await t.start(sink)
        await insert_result(db, prefix, "run-3:4", output={"v": 1})
        await sink.wait_for(1)
        await eventually(lambda: _no_rows(db, prefix, "results"))
        # A second run of the same step (a re-claimed task) answers again.
        await insert_result(db, prefix, "run-3:4", output={"v": 2})
        results = await sink.wait_for(2)
        await eventually(lambda: _no_rows(db, prefix, "results"))
        await asyncio.sleep(0.2)
        assert [(r.step_id, r.output) for r in results] == [
            ("run-3:4", {"v": 1}),
            ("run-3:4", {"v": 2}),
        ]
        assert [len(batch) for batch in sink.batches] == [1, 1]
        # Each time, the row was still in the table while the sink was applying it.
        assert during == [["run-3:4"], ["run-3:4"]]
    finally:
        await t.close()
        await inspector.close()


async def test_a_sink_that_raises_keeps_the_rows_for_the_next_poll(prefix: str, db: Any) -> None:
    t = transport(prefix)
    calls = 0
    second_delivery = asyncio.Event()
    let_through = asyncio.Event()

    async def check(results: Sequence[StepResult]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the store is down")
        second_delivery.set()
        await let_through.wait()

    sink = RecordingSink(check)
    await create_tables(prefix)
    try:
        await insert_result(db, prefix, "run-4:0", output=1)
        await insert_result(db, prefix, "run-4:1", status="failed", error={"message": "boom"})
        await t.start(sink)
        async with asyncio.timeout(10):
            await second_delivery.wait()
        assert calls == 2 and sink.batches == []
        assert [row["step_id"] for row in await rows(db, prefix, "results")] == [
            "run-4:0",
            "run-4:1",
        ]
        let_through.set()
        results = await sink.wait_for(2)
        assert {r.step_id for r in results} == {"run-4:0", "run-4:1"}
        await eventually(lambda: _no_rows(db, prefix, "results"))
    finally:
        let_through.set()
        await t.close()


async def test_malformed_result_rows_are_dropped_and_good_ones_delivered(
    prefix: str, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sink = RecordingSink()
    await create_tables(prefix)
    created = now_ms() - 1000
    await insert_result(db, prefix, "run-5:1", output={"ok": True}, created_at=created)
    await insert_result(db, prefix, "run-5:2", raw_output="{not json", created_at=created + 1)
    await insert_result(db, prefix, "run-5:3", status="exploded", created_at=created + 2)
    await insert_result(db, prefix, "run-5:4", run_id="someone-else", created_at=created + 3)
    await insert_result(db, prefix, "run-5:5", status="failed", created_at=created + 4)
    error = {"message": "no", "code": None, "retryable": False}
    await insert_result(db, prefix, "run-5:6", status="failed", error=error, created_at=created + 5)
    t = transport(prefix)
    caplog.set_level(logging.ERROR, logger="durably.transport.sql")
    try:
        await t.start(sink)
        await eventually(lambda: _no_rows(db, prefix, "results"))
        # A row naming its step consistently fails that step's attempt instead (the run must
        # not wait for a result that never comes); run-5:4 names no step: only deleted.
        await sink.wait_for(5)
        by_step = {result.step_id: result for result in sink.results}
        assert sorted(by_step) == ["run-5:1", "run-5:2", "run-5:3", "run-5:5", "run-5:6"]
        assert by_step["run-5:1"].output == {"ok": True}
        assert by_step["run-5:6"].error == StepError(message="no", retryable=False)
        for step_id in ("run-5:2", "run-5:3", "run-5:5"):
            stand_in = by_step[step_id]
            assert stand_in.status == "failed" and stand_in.error is not None
            assert (stand_in.error.code, stand_in.error.retryable) == ("malformed_result", False)
            assert stand_in.error.message.startswith("malformed step result row")
        logged = "\n".join(record.getMessage() for record in caplog.records)
        for step_id in ("run-5:2", "run-5:3", "run-5:4", "run-5:5"):
            assert f"malformed result row for step '{step_id}'" in logged
    finally:
        await t.close()


async def test_a_task_claimed_by_a_dead_worker_runs_again_after_the_lease(
    prefix: str, db: Any
) -> None:
    t = transport(prefix, lease_ms=800)
    sink = RecordingSink()
    await t.start(sink)
    server = None
    try:
        await t.dispatch(task("run-6", 0, "fragile"))
        await t.dispatch(task("run-6", 1, "fragile"))
        claimed = now_ms()
        tasks = f'"{prefix}_transport_tasks"'
        # seq 0: claimed a moment ago by a worker that then died; seq 1: long ago.
        await db.execute(
            f"UPDATE {tasks} SET claimed_by = 'dead', claimed_at = $1 WHERE seq = 0", claimed
        )
        await db.execute(
            f"UPDATE {tasks} SET claimed_by = 'dead', claimed_at = $1 WHERE seq = 1",
            claimed - 60_000,
        )
        server = await t.step_server(["fragile"], echo, concurrency=4)
        [stale] = await sink.wait_for(1, timeout=5)
        assert stale.step_id == "run-6:1"
        await asyncio.sleep(0.3)
        assert len(sink.results) == 1, "a live claim must not be taken over"
        [row] = await rows(db, prefix, "tasks")
        assert (row["step_id"], row["claimed_by"]) == ("run-6:0", "dead")
        results = await sink.wait_for(2, timeout=5)
        assert results[1].step_id == "run-6:0"
        assert now_ms() - claimed >= 800
    finally:
        if server is not None:
            await server.drain(1)
        await t.close()


async def test_tokens_route_by_grp_exactly(prefix: str, db: Any) -> None:
    t = transport(prefix)
    sink = RecordingSink()
    await t.start(sink)
    groups = ["charge@acme", "charge", "charge@acme-eu", "charge@other", "acme", "charge@ACME"]
    for seq, group in enumerate(groups):
        await t.dispatch(task("run-7", seq, "charge", group=group))
    server = await t.step_server(["charge@acme"], echo, concurrency=4)
    try:
        [result] = await sink.wait_for(1)
        assert result.step_id == "run-7:0"
        await asyncio.sleep(0.3)
        left = await rows(db, prefix, "tasks")
        assert [row["grp"] for row in left] == groups[1:]
        assert all(row["claimed_by"] is None for row in left)
        second = await t.step_server(["charge", "charge@other"], echo, concurrency=4)
        await sink.wait_for(3)
        await second.drain(1)
        assert sorted(r.step_id for r in sink.results) == ["run-7:0", "run-7:1", "run-7:3"]
    finally:
        await server.drain(1)
        await t.close()


async def test_notifications_wake_the_server_and_the_drain_long_before_a_poll(
    prefix: str, db: Any
) -> None:
    t = transport(prefix, poll_ms=60_000)
    sink = RecordingSink()
    await t.start(sink)
    server = await t.step_server(["quick"], echo, concurrency=1)
    try:
        await asyncio.sleep(0.5)  # both pollers found nothing and sleep for a minute
        started = time.monotonic()
        await t.dispatch(task("run-8", 0, "quick"))
        await sink.wait_for(1, timeout=5)
        # A result written by another process (no NOTIFY of its own) wakes the drain too.
        await insert_result(db, prefix, "run-8:1", output=2)
        await sink.wait_for(2, timeout=5)
        assert time.monotonic() - started < 5
    finally:
        await server.drain(1)
        await t.close()


async def test_malformed_task_rows_fail_the_step_or_are_removed(prefix: str, db: Any) -> None:
    t = transport(prefix)
    sink = RecordingSink()
    await t.start(sink)
    called: list[RemoteTask] = []

    async def handler(task: RemoteTask) -> StepResult:
        called.append(task)
        return completed(task, None)

    tasks = f'"{prefix}_transport_tasks"'
    insert = (
        f"INSERT INTO {tasks} (step_id, run_id, seq, name, grp, input, attempt, status, "
        "created_at) VALUES ($1, $2, $3, $4, 'bad', $5, 1, 'pending', $6)"
    )
    await db.execute(insert, "run-9:1", "run-9", 1, "s", "{nope", now_ms())
    await db.execute(insert, "run-9:2", "run-9", 2, "", "null", now_ms())
    await db.execute(insert, "mismatch", "run-9", 3, "s", "null", now_ms())
    server = await t.step_server(["bad"], handler, concurrency=4)
    try:
        results = await sink.wait_for(2)
        await eventually(lambda: _no_rows(db, prefix, "tasks"))
        await asyncio.sleep(0.2)
        assert called == [] and len(sink.results) == 2
        by_id = {r.step_id: r for r in results}
        for step_id in ("run-9:1", "run-9:2"):
            assert by_id[step_id].status == "failed"
            error = by_id[step_id].error
            assert error is not None and error.retryable is False
            assert error.message.startswith("malformed step task")
    finally:
        await server.drain(1)
        await t.close()


async def test_drain_waits_then_hands_unfinished_steps_back(prefix: str, db: Any) -> None:
    t = transport(prefix)
    sink = RecordingSink()
    await t.start(sink)
    started = asyncio.Event()

    async def stuck(task: RemoteTask) -> StepResult:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    await t.dispatch(task("run-10", 0, "stuck"))
    server = await t.step_server(["stuck"], stuck, concurrency=1)
    try:
        async with asyncio.timeout(5):
            await started.wait()
        begun = time.monotonic()
        await server.drain(0.2)
        assert 0.2 <= time.monotonic() - begun < 3
        [row] = await rows(db, prefix, "tasks")
        assert row["claimed_by"] is None and row["claimed_at"] is None  # back in the queue
        replacement = await t.step_server(["stuck"], echo, concurrency=1)
        await sink.wait_for(1)
        await replacement.drain(1)
    finally:
        await t.close()


async def test_a_connection_failure_names_the_server() -> None:
    t = SqlTransport("postgresql://postgres@127.0.0.1:1/test", prefix="unused")
    try:
        with pytest.raises(TransportUnavailableError) as caught:
            await t.dispatch(task("run-11", 0, "x"))
        assert "127.0.0.1:1" in str(caught.value)
        assert "refused" in str(caught.value)
    finally:
        await t.close()


# ------------------------------------------------------------------ re-dispatch of a step id


async def test_a_redispatch_of_the_same_attempt_is_absorbed(prefix: str, db: Any) -> None:
    t = transport(prefix)
    try:
        await t.dispatch(task("run-12", 0, "s", {"v": 1}))
        tasks = f'"{prefix}_transport_tasks"'
        await db.execute(f"UPDATE {tasks} SET claimed_by = 'w1', claimed_at = $1", now_ms())
        await t.dispatch(task("run-12", 0, "s", {"v": 1}))
        [row] = await rows(db, prefix, "tasks")
        assert (row["attempt"], row["claimed_by"]) == (1, "w1")
    finally:
        await t.close()


async def test_a_retry_replaces_an_unclaimed_older_attempt(prefix: str, db: Any) -> None:
    t = transport(prefix)
    try:
        await t.dispatch(task("run-13", 0, "s", {"v": 1}))
        await t.dispatch(task("run-13", 0, "s", {"v": 2}, attempt=2))
        [row] = await rows(db, prefix, "tasks")
        assert (row["attempt"], row["input"], row["claimed_by"]) == (2, '{"v":2}', None)
    finally:
        await t.close()


async def test_a_retry_waits_for_a_finishing_worker_to_delete_its_old_row(
    prefix: str, db: Any
) -> None:
    # The SDK inserts its result, THEN deletes the task: a retry dispatched in between must
    # not be deleted with the old row.
    t = transport(prefix, replace_wait_ms=10_000)
    try:
        await t.dispatch(task("run-14", 0, "s"))
        tasks = f'"{prefix}_transport_tasks"'
        await db.execute(f"UPDATE {tasks} SET claimed_by = 'sdk', claimed_at = $1", now_ms())
        retry = asyncio.create_task(t.dispatch(task("run-14", 0, "s", attempt=2)))
        await asyncio.sleep(0.3)
        assert not retry.done()
        [row] = await rows(db, prefix, "tasks")
        assert row["attempt"] == 1
        await db.execute(f"DELETE FROM {tasks} WHERE step_id = 'run-14:0'")  # the SDK's delete
        async with asyncio.timeout(2):
            await retry
        [row] = await rows(db, prefix, "tasks")
        assert (row["attempt"], row["claimed_by"]) == (2, None)
    finally:
        await t.close()


async def test_a_retry_replaces_an_attempt_still_running_after_the_wait(
    prefix: str, db: Any
) -> None:
    t = transport(prefix, replace_wait_ms=300)
    try:
        await t.dispatch(task("run-15", 0, "s"))
        tasks = f'"{prefix}_transport_tasks"'
        await db.execute(f"UPDATE {tasks} SET claimed_by = 'slow', claimed_at = $1", now_ms())
        begun = time.monotonic()
        await t.dispatch(task("run-15", 0, "s", attempt=2))
        assert time.monotonic() - begun >= 0.3
        [row] = await rows(db, prefix, "tasks")
        assert (row["attempt"], row["claimed_by"]) == (2, None)
    finally:
        await t.close()


async def test_a_retry_dispatched_from_inside_the_sink_gets_its_own_result(
    prefix: str, db: Any
) -> None:
    # The engine may resume the run (and dispatch the retry) before `step_results` returned,
    # i.e. before the transport deleted the first attempt's result row. The retry's result
    # must neither be swallowed by that row nor deleted with it.
    t = transport(prefix)
    inspector = await connect()

    async def flaky(task: RemoteTask) -> StepResult:
        if task.attempt == 1:
            error = StepError(message="try again")
            return StepResult(task.run_id, task.seq, task.step_id, "failed", error=error)
        return completed(task, "second time lucky")

    async def resume_inside(results: Sequence[StepResult]) -> None:
        for result in results:
            if result.status == "failed":
                await t.dispatch(task("run-16", 0, "flaky", attempt=2))

                async def answered() -> bool:
                    return not await inspector.fetchval(
                        f'SELECT count(*) FROM "{prefix}_transport_tasks"'
                    )

                await eventually(answered)  # the retry ran and wrote its result meanwhile

    sink = RecordingSink(resume_inside)
    await t.start(sink)
    server = await t.step_server(["flaky"], flaky, concurrency=1)
    try:
        await t.dispatch(task("run-16", 0, "flaky"))
        first, second = await sink.wait_for(2)
        assert (first.status, second.status, second.output) == (
            "failed",
            "completed",
            "second time lucky",
        )
        await eventually(lambda: _no_rows(db, prefix, "results"))
    finally:
        await server.drain(1)
        await t.close()
        await inspector.close()


async def _no_rows(db: Any, prefix: str, table: str) -> bool:
    return not await rows(db, prefix, table)
