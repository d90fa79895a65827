"""Result rows nobody can store, written straight into the SQL transport's table.

An engine on a PostgreSQL store dispatches its steps over the SQL transport and nobody serves
them: the test plays the worker, with plain asyncpg, as a `durable-worker` in another language
or anyone who can write to `<prefix>_transport_results` would. Unstorable rows come first (the
drain takes the oldest first): they must neither stop the good rows behind them from settling
nor leave their own runs waiting forever.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

import durably
from durably import WorkflowCtx
from durably._core.wire import StepResult
from durably.transports import SqlTransport
from tests.pg_support import PG_URL, fresh_schema, schema_url
from tests.remote.sql_support import (
    RecordingSink,
    create_tables,
    db_fixture,  # noqa: F401
    eventually,
    insert_result,
    now_ms,
    prefix_fixture,  # noqa: F401
    rows,
    transport,
)

pytestmark = pytest.mark.timeout(120)

TIMEOUT = 30


@pytest.fixture
async def store_url() -> AsyncIterator[str]:
    async with fresh_schema() as schema:
        yield schema_url(schema)


async def _task_rows(db: Any, prefix: str, count: int) -> dict[str, dict[str, Any]]:
    """The task rows of `count` runs, by run id, once all are there."""
    found: dict[str, dict[str, Any]] = {}

    async def all_there() -> bool:
        found.clear()
        found.update({row["run_id"]: row for row in await rows(db, prefix, "tasks")})
        return len(found) >= count

    await eventually(all_there, timeout=TIMEOUT)
    return found


async def _status(engine: durably.Engine, run_id: str) -> str | None:
    run = await engine.get_run(run_id)
    return None if run is None else run.status


async def test_unstorable_result_rows_fail_their_steps_and_never_block_the_rows_behind(
    prefix: str, db: Any, store_url: str
) -> None:
    tag = f"{prefix}-rows"

    @durably.workflow(f"{tag}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> Any:
        return await ctx.step(f"{tag}.echo", x)

    await create_tables(prefix)
    engine = durably.Engine(
        store_url,
        transport=SqlTransport(PG_URL, prefix=prefix, poll_ms=50, pool_size=2),
        workflows=[wf],
        steps=[],  # an orchestrator: the test is the worker
        timer_poll_ms=50,
    )
    bad = {
        "nan": {"raw_output": "NaN"},
        "inf": {"raw_output": '{"v": 1e400}'},
        "nanos": {"output": 1, "started_at": time.time_ns()},
        "deep": {"raw_output": "[" * 200_000 + "]" * 200_000},
        "surrogate": {"raw_output": '"\\ud800"'},
        "error-nan": {"status": "failed", "raw_error": '{"message": "x", "details": NaN}'},
    }
    good = ["good-1", "good-2", "good-3"]
    async with engine:
        run_ids = {name: f"{tag}-{name}" for name in [*bad, *good]}
        for i, run_id in enumerate(run_ids.values()):
            await engine.start(wf, i, run_id=run_id)
        tasks = await _task_rows(db, prefix, len(run_ids))
        # The worker's answers: the unstorable ones oldest, a row naming no step among them.
        oldest = now_ms() - 60_000
        await insert_result(db, prefix, "nobody:0", run_id="someone", created_at=oldest)
        for at, (name, columns) in enumerate(bad.items()):
            step_id = tasks[run_ids[name]]["step_id"]
            await insert_result(db, prefix, step_id, created_at=oldest + 1 + at, **columns)
        for at, name in enumerate(good):
            step_id = tasks[run_ids[name]]["step_id"]
            await insert_result(db, prefix, step_id, output={"v": at}, created_at=oldest + 100)

        for at, name in enumerate(good):

            async def completed(run_id: str = run_ids[name]) -> bool:
                return await _status(engine, run_id) == "completed"

            await eventually(completed, timeout=TIMEOUT)
            run = await engine.get_run(run_ids[name])
            assert run is not None and run.output == {"v": at}
        for name in bad:

            async def failed(run_id: str = run_ids[name]) -> bool:
                return await _status(engine, run_id) == "failed"

            await eventually(failed, timeout=TIMEOUT)
            (checkpoint,) = await engine.list_checkpoints(run_ids[name])
            assert checkpoint.status == "failed" and checkpoint.error is not None, name
            assert checkpoint.error.code == "malformed_result", name
            assert "malformed step result row" in checkpoint.error.message, name

        async def no_results() -> bool:
            return not await rows(db, prefix, "results")

        await eventually(no_results, timeout=TIMEOUT)


async def test_a_result_the_sink_keeps_refusing_fails_its_step_and_lets_the_rest_through(
    prefix: str, db: Any
) -> None:
    """The sink refuses one row every time (an error of that row, not an outage): the rows
    behind it settle at once, and after a few tries the refused row's step fails instead."""
    refused: list[str] = []

    async def check(results: Sequence[StepResult]) -> None:
        for result in results:
            if result.step_id == "run-p:0" and result.status == "completed":
                refused.append(result.step_id)
                raise ValueError("the store cannot hold this value")

    sink = RecordingSink(check)
    await create_tables(prefix)
    oldest = now_ms() - 60_000
    await insert_result(db, prefix, "run-p:0", output={"odd": True}, created_at=oldest)
    for seq in range(1, 4):
        await insert_result(db, prefix, f"run-p:{seq}", output=seq, created_at=oldest + seq)
    t = transport(prefix)
    try:
        await t.start(sink)

        async def no_results() -> bool:
            return not await rows(db, prefix, "results")

        await eventually(no_results, timeout=TIMEOUT)
        by_step = {result.step_id: result for result in sink.results}
        assert {by_step[f"run-p:{seq}"].output for seq in range(1, 4)} == {1, 2, 3}
        stand_in = by_step["run-p:0"]
        assert stand_in.status == "failed" and stand_in.error is not None
        assert (stand_in.error.code, stand_in.error.retryable) == ("malformed_result", False)
        assert "the store cannot hold this value" in stand_in.error.message
        assert len(refused) >= 2  # retried before it was given up
    finally:
        await t.close()


async def test_an_outage_keeps_every_row_until_the_store_is_back(prefix: str, db: Any) -> None:
    """A sink that cannot reach its store refuses everything: nothing is given up, however
    often it refuses; once it is back every row settles as the worker wrote it."""
    down = {"on": True, "tries": 0}

    async def check(results: Sequence[StepResult]) -> None:
        if down["on"]:
            down["tries"] += 1
            raise ConnectionRefusedError("the store is down")

    sink = RecordingSink(check)
    await create_tables(prefix)
    for seq in range(3):
        await insert_result(db, prefix, f"run-o:{seq}", output=seq)
    t = transport(prefix)
    try:
        await t.start(sink)

        async def tried_often() -> bool:
            return down["tries"] >= 5

        await eventually(tried_often, timeout=TIMEOUT)
        assert len(await rows(db, prefix, "results")) == 3 and sink.results == []
        down["on"] = False
        results = await sink.wait_for(3, timeout=TIMEOUT)
        assert sorted((r.step_id, r.status, json.dumps(r.output)) for r in results) == [
            ("run-o:0", "completed", "0"),
            ("run-o:1", "completed", "1"),
            ("run-o:2", "completed", "2"),
        ]
    finally:
        await t.close()


async def test_a_task_row_too_deep_or_not_json_fails_its_step_on_a_durably_server(
    prefix: str, db: Any
) -> None:
    """A task row whose `input` would exhaust the parser's recursion (or holds NaN) gets a
    failed, non-retryable result; the good task behind it runs."""
    t = transport(prefix)
    sink = RecordingSink()
    await t.start(sink)

    async def handler(task: Any) -> StepResult:
        return StepResult(task.run_id, task.seq, task.step_id, "completed", task.input)

    insert = (
        f'INSERT INTO "{prefix}_transport_tasks" (step_id, run_id, seq, name, grp, input, '
        "attempt, status, created_at) VALUES ($1, $2, $3, 's', 'tok', $4, 1, 'pending', $5)"
    )
    oldest = now_ms() - 60_000
    await db.execute(insert, "run-t:0", "run-t", 0, "[" * 200_000, oldest)
    await db.execute(insert, "run-t:1", "run-t", 1, '{"v": NaN}', oldest + 1)
    await db.execute(insert, "run-t:2", "run-t", 2, '{"v": 2}', oldest + 2)
    server = await t.step_server(["tok"], handler, concurrency=1)
    try:
        results = await sink.wait_for(3, timeout=TIMEOUT)
        by_step = {r.step_id: r for r in results}
        assert by_step["run-t:2"].output == {"v": 2}
        for step_id in ("run-t:0", "run-t:1"):
            error = by_step[step_id].error
            assert by_step[step_id].status == "failed" and error is not None
            assert error.retryable is False and error.message.startswith("malformed step task")
    finally:
        await server.drain(1)
        await t.close()
