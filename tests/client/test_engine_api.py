"""Engine API: start/execute, idempotency, validation, versions, requeue, retry_with_input,
events/metrics and the execution-timeout sweep."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import durably
from durably import (
    FatalError,
    InputValidationError,
    RunFailedError,
    RunIdConflictError,
    WorkflowCtx,
    WorkflowNotFoundError,
)
from tests.engine_support import (
    RESULT_TIMEOUT,
    EngineFactory,
    EventLog,
    bump,
    shape,
    wait_status,
    wait_waiting_on,
)


async def test_start_is_idempotent_by_run_id(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        bump(counts, "body")
        return x * 2

    async with engine_factory() as engine:
        h1 = await engine.start(wf, 1, run_id=f"{uid}-r")
        h2 = await engine.start(wf, 1, run_id=f"{uid}-r")
        assert await h1.result(timeout=RESULT_TIMEOUT) == 2
        # Even after completion, a restart with the same id returns the existing run.
        h3 = await engine.start(wf, 99, run_id=f"{uid}-r")
        assert await h3.result(timeout=RESULT_TIMEOUT) == 2
        runs = await engine.list_runs(workflow=f"{uid}.wf")
        run = await engine.get_run(f"{uid}-r")

    assert h1.run_id == h2.run_id == h3.run_id == f"{uid}-r"
    assert counts == {"body": 1}
    assert [r.id for r in runs] == [f"{uid}-r"]
    assert run is not None and run.input == 1


async def test_run_id_conflict_with_another_workflow(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.a")
    async def a(ctx: WorkflowCtx) -> str:
        return "a"

    @durably.workflow(f"{uid}.b")
    async def b(ctx: WorkflowCtx) -> str:
        return "b"

    async with engine_factory() as engine:
        assert await engine.execute(a, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == "a"
        before = await engine.get_run(f"{uid}-r")
        with pytest.raises(RunIdConflictError) as info:
            await engine.start(b, run_id=f"{uid}-r")
        after = await engine.get_run(f"{uid}-r")
        runs = await engine.list_runs()

    assert info.value.run_id == f"{uid}-r"
    assert info.value.existing_workflow == f"{uid}.a"
    assert info.value.requested_workflow == f"{uid}.b"
    assert before == after
    assert [r.id for r in runs] == [f"{uid}-r"]


async def test_unknown_workflow_name(engine_factory: EngineFactory, uid: str):
    async with engine_factory() as engine:
        with pytest.raises(WorkflowNotFoundError, match="is not registered"):
            await engine.start(f"{uid}.nope", {"x": 1})
        with pytest.raises(WorkflowNotFoundError):
            await engine.execute(f"{uid}.nope", timeout=RESULT_TIMEOUT)
        assert await engine.list_runs() == []


async def test_unknown_workflow_name_names_close_matches(engine_factory: EngineFactory, uid: str):
    # A typo in a start by name is refused with the registered names it is close to, and
    # no run is written; a name close to nothing registered gets no suggestion.
    @durably.workflow(f"{uid}.invoices.convert")
    async def convert(ctx: WorkflowCtx, x: int) -> int:
        return x

    async with engine_factory() as engine:
        engine.register(convert)
        with pytest.raises(WorkflowNotFoundError) as typo:
            await engine.start(f"{uid}.invoices.convrt", 1)
        with pytest.raises(WorkflowNotFoundError) as far:
            await engine.start("zz-unrelated", 1)
        handle = await engine.start(f"{uid}.invoices.convert", 2)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 2
        assert [r.workflow for r in await engine.list_runs()] == [f"{uid}.invoices.convert"]

    # Best match first (workflows of other tests in this process may follow it).
    assert str(typo.value).startswith(
        f"workflow {uid}.invoices.convrt is not registered; did you mean '{uid}.invoices.convert'"
    )
    assert "did you mean" not in str(far.value)


class Payment(BaseModel):
    amount: int
    currency: str


async def test_input_validation_creates_no_run(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.pay")
    async def pay(ctx: WorkflowCtx, p: Payment) -> str:
        return f"{p.amount} {p.currency}"

    def positive(value: Any) -> str | None:
        return None if value > 0 else "must be positive"

    @durably.workflow(f"{uid}.pos", validate_input=positive)
    async def pos(ctx: WorkflowCtx, x: int) -> int:
        return x

    async with engine_factory() as engine:
        with pytest.raises(InputValidationError) as info:
            await engine.start(pay, {"amount": "lots", "currency": "EUR"}, run_id=f"{uid}-bad")
        with pytest.raises(InputValidationError):
            await engine.start(pay, {"currency": "EUR"})
        with pytest.raises(InputValidationError, match="must be positive"):
            await engine.start(pos, -1)
        assert await engine.list_runs() == []
        assert await engine.get_run(f"{uid}-bad") is None
        out = await engine.execute(pay, {"amount": "5", "currency": "EUR"}, timeout=RESULT_TIMEOUT)
        runs = await engine.list_runs()

    assert info.value.workflow == f"{uid}.pay"
    assert isinstance(info.value.details, list) and info.value.details
    assert info.value.details[0]["loc"] == ["amount"]
    assert out == "5 EUR"
    assert len(runs) == 1 and runs[0].input == {"amount": 5, "currency": "EUR"}


async def test_pinned_version_start(engine_factory: EngineFactory, uid: str):
    name = f"{uid}.versioned"

    @durably.workflow(name, version="1")
    async def v1(ctx: WorkflowCtx) -> str:
        return "v1"

    @durably.workflow(name, version="2")
    async def v2(ctx: WorkflowCtx) -> str:
        return "v2"

    async with engine_factory() as engine:
        latest = await engine.start(name)
        pinned = await engine.start(name, version="1")
        by_object = await engine.start(v1)
        assert await latest.result(timeout=RESULT_TIMEOUT) == "v2"
        assert await pinned.result(timeout=RESULT_TIMEOUT) == "v1"
        assert await by_object.result(timeout=RESULT_TIMEOUT) == "v1"
        with pytest.raises(WorkflowNotFoundError, match="registered: 1, 2"):
            await engine.start(name, version="3")
        rows = {h: await engine.get_run(h.run_id) for h in (latest, pinned, by_object)}
        count = len(await engine.list_runs(workflow=name))

    assert rows[latest] is not None and rows[latest].workflow_version == "2"
    assert rows[pinned] is not None and rows[pinned].workflow_version == "1"
    assert rows[by_object] is not None and rows[by_object].workflow_version == "1"
    assert count == 3


async def test_execute_output_and_failure(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.ok")
    async def ok(ctx: WorkflowCtx, x: int) -> dict[str, int]:
        return {"x": x}

    @durably.workflow(f"{uid}.bad")
    async def bad(ctx: WorkflowCtx, x: int) -> int:
        raise FatalError("bad input", code="E_BAD", details={"x": x})

    @durably.workflow(f"{uid}.crash")
    async def crash(ctx: WorkflowCtx) -> int:
        raise KeyError("missing")

    async with engine_factory() as engine:
        assert await engine.execute(ok, 3, timeout=RESULT_TIMEOUT) == {"x": 3}
        with pytest.raises(RunFailedError) as info:
            await engine.execute(bad, 4, run_id=f"{uid}-bad", timeout=RESULT_TIMEOUT)
        with pytest.raises(RunFailedError) as crashed:
            await engine.execute(crash, timeout=RESULT_TIMEOUT)

    assert info.value.run_id == f"{uid}-bad"
    assert info.value.status == "failed"
    assert info.value.error is not None
    assert info.value.error.code == "E_BAD"
    assert info.value.error.details == {"x": 4}
    assert info.value.error.message == "bad input"
    assert crashed.value.error is not None
    assert crashed.value.error.code is None
    assert "missing" in crashed.value.error.message
    assert crashed.value.error.stack is not None and "KeyError" in crashed.value.error.stack


async def test_cancel_suspended_run(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.never"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(token)

    async with engine_factory() as engine:
        events = EventLog(engine)
        handle = await engine.start(wf)
        await wait_waiting_on(engine, handle.run_id, token)
        result = await engine.cancel(handle.run_id)
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        row = await engine.get_run(handle.run_id)
        unknown = await engine.cancel(f"{uid}-nope")

    assert result is not None and result.status == "cancelled"
    assert info.value.status == "cancelled"
    assert row is not None and row.status == "cancelled"
    assert row.error is not None and row.error.message == "cancelled"
    assert row.locked_by is None
    assert unknown is None
    assert events.types(handle.run_id)[-1] == "run.failed"


async def test_requeue_reruns_only_the_failed_step(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}
    state = {"fail": True}

    @durably.step(f"{uid}.first")
    def first(x: int) -> int:
        bump(counts, "first")
        return x + 1

    @durably.step(f"{uid}.second")
    def second(x: int) -> int:
        bump(counts, "second")
        if state["fail"]:
            raise RuntimeError("downstream unavailable")
        return x * 10

    @durably.step(f"{uid}.third")
    def third(x: int) -> int:
        bump(counts, "third")
        return x + 3

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        a = await ctx.step(first, x)
        b = await ctx.step(second, a)
        return await ctx.step(third, b)

    async with engine_factory() as engine:
        handle = await engine.start(wf, 1)
        with pytest.raises(RunFailedError):
            await handle.result(timeout=RESULT_TIMEOUT)
        failed_row = await engine.get_run(handle.run_id)
        failed_cps = await engine.list_checkpoints(handle.run_id)

        state["fail"] = False
        result = await engine.retry(handle.run_id)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 23
        cps = await engine.list_checkpoints(handle.run_id)
        row = await engine.get_run(handle.run_id)
        unknown = await engine.retry(f"{uid}-nope")

    assert failed_row is not None and failed_row.status == "failed"
    assert failed_row.error is not None and failed_row.error.message == "downstream unavailable"
    assert shape(failed_cps) == [
        (0, f"{uid}.first", "remote", "completed"),
        (1, f"{uid}.second", "remote", "failed"),
    ]
    assert result is not None and result.status == "pending"
    assert counts == {"first": 1, "second": 2, "third": 1}
    assert shape(cps) == [
        (0, f"{uid}.first", "remote", "completed"),
        (1, f"{uid}.second", "remote", "completed"),
        (2, f"{uid}.third", "remote", "completed"),
    ]
    assert row is not None and row.status == "completed" and row.error is None
    assert unknown is None


async def test_retry_with_input(engine_factory: EngineFactory, uid: str):
    @durably.workflow(f"{uid}.wf", tags=("static",))
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        if x < 0:
            raise FatalError("negative", code="NEG")
        return x * 2

    async with engine_factory() as engine:
        handle = await engine.start(wf, -1, run_id=f"{uid}-r", tags=["mine"])
        with pytest.raises(RunFailedError):
            await handle.result(timeout=RESULT_TIMEOUT)
        new_id = await engine.retry_with_input(handle.run_id, 5)
        assert new_id is not None
        assert await engine.get_handle(new_id).result(timeout=RESULT_TIMEOUT) == 10
        original = await engine.get_run(handle.run_id)
        retried = await engine.get_run(new_id)
        custom = await engine.retry_with_input(handle.run_id, 6, new_run_id=f"{uid}-fixed")
        assert custom == f"{uid}-fixed"
        assert await engine.get_handle(custom).result(timeout=RESULT_TIMEOUT) == 12
        unknown = await engine.retry_with_input(f"{uid}-nope", 1)

    assert new_id.startswith(f"{uid}-r~retry~") and len(new_id) == len(f"{uid}-r~retry~") + 8
    assert original is not None and original.status == "failed"  # untouched
    assert retried is not None and retried.input == 5 and retried.workflow == f"{uid}.wf"
    assert retried.tags is not None and set(retried.tags) == {"static", "mine"}
    assert unknown is None


async def test_events_and_metrics(engine_factory: EngineFactory, uid: str):
    @durably.step(f"{uid}.s")
    def s(x: int) -> int:
        if x < 0:
            raise FatalError("neg")
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        a = await ctx.step(s, abs(x))
        b = await ctx.step(s, x)
        return a + b

    async with engine_factory() as engine:
        events = EventLog(engine)
        ok = await engine.start(wf, 2)
        assert await ok.result(timeout=RESULT_TIMEOUT) == 4
        bad = await engine.start(wf, -2)
        with pytest.raises(RunFailedError):
            await bad.result(timeout=RESULT_TIMEOUT)
        metrics = engine.metrics()
        events.unsubscribe()
        assert await engine.execute(wf, 1, timeout=RESULT_TIMEOUT) == 2
        after_unsubscribe = len(events.events)
        metrics_after = engine.metrics()
        series = engine.metric_series()

    assert events.types(ok.run_id) == [
        "run.started",
        "step.started",
        "step.completed",
        "step.started",
        "step.completed",
        "run.completed",
    ]
    assert events.types(bad.run_id) == [
        "run.started",
        "step.started",
        "step.completed",
        "step.started",
        "step.failed",
        "run.failed",
    ]
    completed = events.of(ok.run_id, "step.completed")
    assert [(e.seq, e.name, e.kind, e.output) for e in completed] == [
        (0, f"{uid}.s", "remote", 2),
        (1, f"{uid}.s", "remote", 2),
    ]
    assert all(e.duration_ms is not None and e.duration_ms >= 0 for e in completed)
    done = events.of(ok.run_id, "run.completed")[0]
    assert done.output == 4 and done.workflow == f"{uid}.wf" and done.namespace == "default"
    fail = events.of(bad.run_id, "run.failed")[0]
    assert fail.error is not None and fail.error.message == "neg"
    assert after_unsubscribe == len(events.events)

    assert metrics.runs["started"] == 2
    assert metrics.runs["completed"] == 1
    assert metrics.runs["failed"] == 1
    assert metrics.steps == {"started": 4, "completed": 3, "failed": 1}
    assert metrics.by_workflow == {f"{uid}.wf": {"started": 2, "completed": 1, "failed": 1}}
    assert metrics.step_duration["count"] == 3
    assert metrics_after.runs["started"] == 3 and metrics_after.runs["completed"] == 2
    # With nobody listening, step events are counted without being built (the hot path).
    assert metrics_after.steps == {"started": 6, "completed": 5, "failed": 1}
    assert metrics_after.step_duration["count"] == 5
    # The labelled series behind the Prometheus exposition, counted on both paths.
    wf_step = (f"{uid}.wf", f"{uid}.s")
    assert series.counters["runs_started"] == {(f"{uid}.wf",): 3}
    assert series.counters["steps_completed"] == {wf_step: 5}
    assert series.counters["steps_failed"] == {(*wf_step, ""): 1}
    assert series.histograms["step_seconds"][wf_step].count == 5
    assert series.histograms["run_seconds"][(f"{uid}.wf", "completed")].count == 2
    assert done.duration_ms is not None and done.duration_ms >= 0  # the run's life


async def test_execution_timeout_cancels_the_run(engine_factory: EngineFactory, uid: str):
    token = f"{uid}.never"

    @durably.workflow(f"{uid}.slow", execution_timeout="200ms")
    async def slow(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(token)

    @durably.workflow(f"{uid}.fast", execution_timeout="5s")
    async def fast(ctx: WorkflowCtx) -> Any:
        return await ctx.wait_for_signal(token + ".fast")

    async with engine_factory() as engine:
        events = EventLog(engine)
        handle = await engine.start(slow)
        other = await engine.start(fast)
        row = await wait_status(engine, handle.run_id, "cancelled")
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        other_row = await engine.get_run(other.run_id)
        await engine.signal(token + ".fast", "ok")
        assert await other.result(timeout=RESULT_TIMEOUT) == "ok"

    assert row.error is not None
    assert row.error.code == "execution_timeout"
    assert row.error.message == "execution timeout"
    assert info.value.status == "cancelled"
    assert other_row is not None and other_row.status == "suspended"
    assert events.types(handle.run_id)[-1] == "run.failed"


async def test_non_json_input_and_output_are_clear_errors(engine_factory: EngineFactory, uid: str):
    """Bad input changes nothing; a body returning a non-JSON value fails its run cleanly."""

    @durably.workflow(f"{uid}.echo")
    async def echo(ctx: WorkflowCtx, x: Any) -> Any:
        return x

    @durably.workflow(f"{uid}.odd")
    async def odd(ctx: WorkflowCtx) -> Any:
        return {"when": object()}

    async with engine_factory() as engine:
        with pytest.raises(InputValidationError, match="not JSON-serializable"):
            await engine.start(echo, {"x": object()}, run_id=f"{uid}-bad")
        with pytest.raises(InputValidationError):
            await engine.start(echo, float("nan"))
        assert await engine.get_run(f"{uid}-bad") is None
        assert await engine.list_runs() == []
        handle = await engine.start(odd, run_id=f"{uid}-odd")
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        run = await engine.get_run(handle.run_id)

    assert info.value.error is not None and info.value.error.code == "serialization"
    assert "cannot be stored" in info.value.error.message
    assert run is not None and run.status == "failed" and run.output is None
