"""ctx.local_step, ctx.side_effect and ctx.now, and the concurrency and replay behaviour of
steps: gathered steps, caught failures, nested ctx calls, the replay-aware logger.

ctx.step itself (outputs, typed I/O, retries, cancellation) is in test_steps.py.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import durably
from durably import (
    FatalError,
    NestedWorkflowCallError,
    RemoteStepError,
    RunFailedError,
    StepFailedError,
    WorkflowCtx,
)
from tests.engine_support import (
    RESULT_TIMEOUT,
    EngineFactory,
    EventLog,
    bump,
    shape,
    wait_suspended,
    wait_until,
)

# ------------------------------------------------------------ local_step / side_effect


async def test_local_step_logger_events_on_checkpoint(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        def body(log: Any) -> int:
            bump(counts, "sync")
            log.info("computing", {"x": x})
            log.warn("careful")
            return x * 3

        async def abody(log: Any) -> int:
            bump(counts, "async")
            log.debug("async body")
            await asyncio.sleep(0)
            return x + 1

        a = await ctx.local_step("triple", body)
        b = await ctx.local_step("plus", abody)
        return a + b

    async with engine_factory() as engine:
        events = EventLog(engine)
        handle = await engine.start(wf, 2)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 9
        cps = await engine.list_checkpoints(handle.run_id)

    assert counts == {"sync": 1, "async": 1}
    assert shape(cps) == [
        (0, "triple", "local", "completed"),
        (1, "plus", "local", "completed"),
    ]
    assert cps[0].output == 6
    assert cps[0].events is not None
    assert [(e.level, e.message, e.data) for e in cps[0].events] == [
        ("info", "computing", {"x": 2}),
        ("warn", "careful", None),
    ]
    assert all(isinstance(e.at, int) and e.at > 0 for e in cps[0].events)
    assert cps[1].events is not None
    assert [(e.level, e.message) for e in cps[1].events] == [("debug", "async body")]
    kinds = [(e.type, e.name, e.kind) for e in events.of(handle.run_id, "step.started")]
    assert kinds == [("step.started", "triple", "local"), ("step.started", "plus", "local")]


async def test_local_step_retries_and_failure(engine_factory: EngineFactory, uid: str):
    calls: list[int] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        def flaky(log: Any) -> str:
            calls.append(1)
            log.info(f"attempt {len(calls)}")
            if len(calls) < 2:
                raise RuntimeError("transient")
            return "ok"

        def fatal(log: Any) -> str:
            calls.append(2)
            raise FatalError("stop", code="STOP")

        first = await ctx.local_step("flaky", flaky, retries=3, backoff_ms="5ms")
        try:
            await ctx.local_step("fatal", fatal, retries=3)
        except FatalError as exc:
            return [first, exc.code]
        return [first, None]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == ["ok", "STOP"]
        cps = await engine.list_checkpoints(handle.run_id)

    assert calls == [1, 1, 2]
    assert shape(cps) == [(0, "flaky", "local", "completed"), (1, "fatal", "local", "failed")]
    assert cps[0].attempts == 2
    # Events are per attempt: only the successful attempt's log is stored.
    assert cps[0].events is not None
    assert [e.message for e in cps[0].events] == ["attempt 2"]
    assert cps[1].error is not None and cps[1].error.code == "STOP"


async def test_side_effect_recorded_once(engine_factory: EngineFactory, uid: str):
    calls: list[int] = []
    seen: list[Any] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        def roll() -> dict[str, Any]:
            calls.append(1)
            return {"roll": 1000 + len(calls), "tuple": (1, 2)}

        value = await ctx.side_effect(roll)
        seen.append(value)
        await ctx.sleep("20ms")
        seen.append(value)
        again = await ctx.side_effect(lambda: "second")
        return [value, again]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert calls == [1]
    # JSON round trip: the live value equals the replayed one (tuples become lists).
    assert out == [{"roll": 1001, "tuple": [1, 2]}, "second"]
    assert all(v == {"roll": 1001, "tuple": [1, 2]} for v in seen)
    assert shape(cps) == [
        (0, "sideEffect", "local", "completed"),
        (1, "sleep", "sleep", "completed"),
        (2, "sideEffect", "local", "completed"),
    ]
    assert cps[0].output == {"roll": 1001, "tuple": [1, 2]}


async def test_now_is_aware_utc_and_stable_on_replay(engine_factory: EngineFactory, uid: str):
    seen: list[datetime] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        t = await ctx.now()
        seen.append(t)
        await ctx.sleep("20ms")
        t2 = await ctx.now()
        seen.append(t2)
        assert t2 >= t
        return t.isoformat()

    async with engine_factory() as engine:
        before = datetime.now(UTC)
        handle = await engine.start(wf)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        after = datetime.now(UTC)
        cps = await engine.list_checkpoints(handle.run_id)

    first = datetime.fromisoformat(out)
    assert first.utcoffset() == timedelta(0)
    assert before - timedelta(milliseconds=1) <= first <= after
    assert all(t.tzinfo is not None and t.utcoffset() == timedelta(0) for t in seen)
    # Every (re)play of the first ctx.now() saw the same recorded instant, and of the
    # second one the same later instant: exactly two distinct values.
    assert seen[0] == first
    assert len(set(seen)) == 2
    assert shape(cps) == [
        (0, "now", "local", "completed"),
        (1, "sleep", "sleep", "completed"),
        (2, "now", "local", "completed"),
    ]
    assert cps[0].output == int(first.timestamp() * 1000)


async def test_nested_ctx_call_inside_local_step(engine_factory: EngineFactory, uid: str):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.inner")
    def inner(x: int) -> int:
        bump(counts, "inner")
        return x

    @durably.workflow(f"{uid}.catching")
    async def catching(ctx: WorkflowCtx) -> Any:
        def bad(log: Any) -> Any:
            return ctx.step(inner, 1)

        try:
            await ctx.local_step("outer", bad)
        except StepFailedError as exc:
            # the recorded failure is re-raised identically on replay (durably decision)
            live = isinstance(exc.__cause__, NestedWorkflowCallError)
            return {
                "code": exc.code,
                "names_primitive_and_step": "ctx.step()" in str(exc) and "'outer'" in str(exc),
                "cause_when_live": live or exc.__cause__ is None,
            }
        return None

    @durably.workflow(f"{uid}.failing")
    async def failing(ctx: WorkflowCtx) -> Any:
        async def bad(log: Any) -> Any:
            await ctx.sleep(1)

        await ctx.local_step("outer", bad)
        return "unreachable"

    async with engine_factory() as engine:
        handle = await engine.start(catching)
        assert await handle.result(timeout=RESULT_TIMEOUT) == {
            "code": "nested_workflow_call",
            "names_primitive_and_step": True,
            "cause_when_live": True,
        }
        caught_cps = await engine.list_checkpoints(handle.run_id)

        failed = await engine.start(failing)
        with pytest.raises(RunFailedError) as info:
            await failed.result(timeout=RESULT_TIMEOUT)
        failed_cps = await engine.list_checkpoints(failed.run_id)

    assert counts == {}
    # The nested call claimed no position: only the local step row exists.
    assert shape(caught_cps) == [(0, "outer", "local", "failed")]
    assert caught_cps[0].error is not None
    assert caught_cps[0].error.code == "nested_workflow_call"
    assert info.value.error is not None
    assert info.value.error.code == "nested_workflow_call"
    assert "ctx.sleep()" in info.value.error.message
    assert shape(failed_cps) == [(0, "outer", "local", "failed")]


async def test_suspended_run_is_never_replayed_when_resident(
    engine_factory: EngineFactory, uid: str
):
    """The body count tells the modes apart; the outcome and history do not."""
    runs: list[int] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        runs.append(1)
        payload = await ctx.wait_for_signal(f"{uid}.go")
        return f"got {payload}"

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await wait_suspended(engine, handle.run_id)
        await engine.signal(f"{uid}.go", "x")
        assert await handle.result(timeout=RESULT_TIMEOUT) == "got x"

    assert len(runs) == (2 if engine_factory.replay else 1)


# ------------------------------------------------------------ concurrency & replay


async def test_gathered_steps_claim_seqs_in_issue_order(engine_factory: EngineFactory, uid: str):
    """Positions are claimed when the primitive is called, not when it completes."""

    @durably.step(f"{uid}.slow")
    async def slow(x: int) -> int:
        await asyncio.sleep(0.05)
        return x

    @durably.step(f"{uid}.fast")
    async def fast(x: int) -> int:
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[int]:
        a, b = await asyncio.gather(ctx.step(slow, 1), ctx.step(fast, 2))
        return [a, b]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == [1, 2]
        cps = await engine.list_checkpoints(handle.run_id)

    assert [(cp.seq, cp.name, cp.output) for cp in cps] == [
        (0, f"{uid}.slow", 1),
        (1, f"{uid}.fast", 2),
    ]


async def test_gathered_steps_execute_exactly_once(
    engine_factory: EngineFactory, uid: str, request: pytest.FixtureRequest
):
    counts: dict[str, int] = {}

    @durably.step(f"{uid}.slow")
    async def slow(x: int) -> int:
        bump(counts, "slow")
        await asyncio.sleep(0.2)
        return x

    @durably.step(f"{uid}.fast")
    async def fast(x: int) -> int:
        bump(counts, "fast")
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> list[Any]:
        a, b = await asyncio.gather(ctx.step(slow, 1), ctx.step(fast, 2))
        c, _ = await asyncio.gather(ctx.step(slow, 3), ctx.sleep("10ms"))
        return [a, b, c]

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == [1, 2, 3]
        await asyncio.sleep(0.25)  # let any orphaned duplicate finish before counting

    assert counts == {"slow": 2, "fast": 1}


async def test_caught_local_step_failure_is_not_rerun_on_replay(
    engine_factory: EngineFactory, uid: str, request: pytest.FixtureRequest
):
    """A body that caught a failed local step took a branch; replay must take the same one."""
    calls: list[int] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        def flaky(log: Any) -> str:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("first attempt fails")
            return "ok"

        try:
            outcome = await ctx.local_step("flaky", flaky)
        except Exception:  # whatever class a replay re-raises the recorded failure as
            outcome = "caught"
        await ctx.sleep("20ms")
        return outcome

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        out = await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)

    assert out == "caught"
    assert calls == [1]
    assert shape(cps) == [(0, "flaky", "local", "failed"), (1, "sleep", "sleep", "completed")]


async def test_local_step_running_row_while_body_executes(engine_factory: EngineFactory, uid: str):
    gate = asyncio.Event()
    calls: list[int] = []

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        async def body(log: Any) -> str:
            calls.append(1)
            await gate.wait()
            return "released"

        return await ctx.local_step("gated", body)

    async with engine_factory() as engine:
        handle = await engine.start(wf)

        async def running_row() -> bool:
            return shape(await engine.list_checkpoints(handle.run_id)) == [
                (0, "gated", "local", "running")
            ]

        await wait_until(running_row)
        run = await engine.get_run(handle.run_id)
        gate.set()
        assert await handle.result(timeout=RESULT_TIMEOUT) == "released"
        cps = await engine.list_checkpoints(handle.run_id)

    assert run is not None and run.status == "running"
    assert calls == [1]
    assert shape(cps) == [(0, "gated", "local", "completed")]


async def test_nested_ctx_call_inside_sync_step(engine_factory: EngineFactory, uid: str):
    holder: dict[str, WorkflowCtx] = {}

    @durably.step(f"{uid}.sneaky", retries=3)
    def sneaky(x: int) -> int:
        holder["ctx"].sleep(1)  # a workflow primitive from a step thread
        return x

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> Any:
        holder["ctx"] = ctx
        try:
            return await ctx.step(sneaky, 1)
        except RemoteStepError as exc:
            return exc.code

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "nested_workflow_call"
        cps = await engine.list_checkpoints(handle.run_id)

    assert shape(cps) == [(0, f"{uid}.sneaky", "remote", "failed")]
    assert cps[0].attempts == 1  # a FatalError subclass: not retried


async def test_replay_aware_logger_and_identity(
    engine_factory: EngineFactory, uid: str, caplog: pytest.LogCaptureFixture
):
    identity: list[tuple[str, str, str]] = []

    @durably.workflow(f"{uid}.wf", version="7")
    async def wf(ctx: WorkflowCtx) -> str:
        identity.append((ctx.run_id, ctx.workflow, ctx.version))
        ctx.logger.info("line A")
        await ctx.side_effect(lambda: 1)
        ctx.logger.info("line B")
        await ctx.sleep("10ms")
        ctx.logger.info("line C")
        return "ok"

    caplog.set_level("INFO", logger=f"durably.workflow.{uid}.wf")
    async with engine_factory() as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        assert await handle.result(timeout=RESULT_TIMEOUT) == "ok"

    lines = [r.getMessage() for r in caplog.records if r.name == f"durably.workflow.{uid}.wf"]
    assert lines == ["line A", "line B", "line C"]  # each once, even when replayed
    assert set(identity) == {(f"{uid}-r", f"{uid}.wf", "7")}
