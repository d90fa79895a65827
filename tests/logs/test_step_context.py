"""The step logger of `@step` handlers and local steps (`durably.StepContext`): what a
handler records is checkpointed with its attempt, visible in the run detail and streamed as
`step.progress`; sub-processes, bounds, `durably.current_step()`, and the declaration rules
of a StepContext parameter."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

import durably
from durably import StepContext, WorkflowCtx
from durably._engine.defs.step_context import MAX_DATA_BYTES, MAX_STEP_EVENTS
from durably.transports import InMemoryTransport
from tests.engine_support import RESULT_TIMEOUT, EngineFactory, EventLog


def _lines(events: Any) -> list[tuple[Any, ...]]:
    return [(e.level, e.message, e.sub_id is not None, e.name, e.phase, e.status) for e in events]


async def test_step_handlers_record_events_sync_and_async(
    engine_factory: EngineFactory, uid: str
) -> None:
    threads: list[int] = []

    @durably.step(name=f"{uid}.sync")
    def sync_step(x: int, log: StepContext) -> int:
        threads.append(threading.get_ident())
        log.info("sync start", {"x": x})
        assert durably.current_step() is log  # the same context, ambient on the pool thread
        with log.sub_process("fetch", group="io") as sub:
            sub.phase("connected", {"host": "a"})
            log.debug("inside fetch")
        log.sub("validate", "skipped", "nothing to validate")
        return x * 2

    @durably.step(name=f"{uid}.async")
    async def async_step(x: int, *, log: StepContext) -> int:
        await asyncio.sleep(0)
        durably.current_step().warn("async line")
        log.error("bad", {"code": 1})
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        a = await ctx.step(sync_step, x)
        return await ctx.step(async_step, a)

    async with engine_factory() as engine:
        live = EventLog(engine)
        handle = await engine.start(wf, 3)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 7
        detail = await engine.get_run_detail(handle.run_id)

    assert threads and threads[0] != threading.get_ident()  # it did run on the pool
    assert detail is not None
    by_name = {cp.name: cp for cp in detail.timeline}
    sync_events = by_name[f"{uid}.sync"].events
    assert sync_events is not None
    assert _lines(sync_events) == [
        ("info", "sync start", False, None, None, None),
        ("info", "fetch", True, "fetch", "connected", None),
        ("debug", "inside fetch", True, None, None, None),
        ("info", "fetch", True, "fetch", None, "ok"),
        ("warn", "nothing to validate", True, "validate", None, "skipped"),
    ]
    fetch = [e for e in sync_events if e.name == "fetch"]
    assert len({e.sub_id for e in fetch}) == 1 and fetch[0].group == "io"
    assert sync_events[2].sub_id == fetch[0].sub_id  # a line inside is tagged with its id
    assert isinstance(fetch[1].data, dict) and isinstance(fetch[1].data["durationMs"], int)
    async_events = by_name[f"{uid}.async"].events
    assert async_events is not None
    assert [(e.level, e.message, e.data) for e in async_events] == [
        ("warn", "async line", None),
        ("error", "bad", {"code": 1}),
    ]
    # Streamed live, in order, one step.progress per recorded event (sync ones from the
    # pool thread arrive through the loop).
    progress = live.of(handle.run_id, "step.progress")
    assert [(p.name, p.event.message if p.event else None) for p in progress] == [
        *((f"{uid}.sync", e.message) for e in sync_events),
        *((f"{uid}.async", e.message) for e in async_events),
    ]
    assert {p.seq for p in progress if p.name == f"{uid}.async"} == {1}


async def test_failed_attempts_keep_their_events(engine_factory: EngineFactory, uid: str) -> None:
    @durably.step(name=f"{uid}.flaky", retries=2, backoff_ms=1)
    def flaky(log: StepContext) -> str:
        log.info(f"attempt {log.attempt}")
        if log.attempt < 2:
            with log.sub_process("call"):
                raise RuntimeError("boom")
        return "ok"

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> str:
        return await ctx.step(flaky)

    async with engine_factory() as engine:
        live = EventLog(engine)
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == "ok"
        cps = await engine.list_checkpoints(handle.run_id)

    [cp] = cps
    assert cp.events is not None
    assert [e.message for e in cp.events] == ["attempt 2"]  # the row of the attempt that won
    failed = [p.event for p in live.of(handle.run_id, "step.progress") if p.event is not None]
    assert [(e.message, e.status) for e in failed] == [
        ("attempt 1", None),
        ("boom", "failed"),
        ("attempt 2", None),
    ]


async def test_local_step_log_is_a_step_context(engine_factory: EngineFactory, uid: str) -> None:
    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> int:
        def body(log: StepContext) -> int:
            assert isinstance(log, StepContext) and durably.current_step() is log
            with log.sub_process("inner") as sub:
                sub.fail("gave up")
            return 1

        return await ctx.local_step("local", body)

    async with engine_factory() as engine:
        live = EventLog(engine)
        handle = await engine.start(wf)
        assert await handle.result(timeout=RESULT_TIMEOUT) == 1
        [cp] = await engine.list_checkpoints(handle.run_id)

    assert cp.events is not None
    assert [(e.level, e.message, e.status) for e in cp.events] == [("error", "gave up", "failed")]
    assert [p.kind for p in live.of(handle.run_id, "step.progress")] == ["local"]


async def test_events_past_the_cap_are_dropped_and_counted(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.step(name=f"{uid}.chatty")
    async def chatty(log: StepContext) -> None:
        for i in range(MAX_STEP_EVENTS + 50):
            log.debug(f"line {i}")
        log.info("huge", {"blob": "x" * (MAX_DATA_BYTES + 1)})
        log.info("y" * 5000)

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx) -> None:
        await ctx.step(chatty)

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        await handle.result(timeout=RESULT_TIMEOUT)
        [cp] = await engine.list_checkpoints(handle.run_id)

    assert cp.events is not None and len(cp.events) == MAX_STEP_EVENTS
    assert [e.message for e in cp.events[:2]] == ["line 0", "line 1"]
    last = cp.events[-1]
    # 552 recorded, MAX_STEP_EVENTS - 1 kept, then the line counting the 53 dropped.
    assert last.level == "warn" and last.data == {"dropped": 53}
    assert "dropped" in last.message


async def test_data_is_bounded_and_checked() -> None:
    log = StepContext("r", 0, "s")
    log.info("big", {"blob": "x" * (MAX_DATA_BYTES + 1)})
    log.info("m" * 5000)
    with pytest.raises(TypeError, match="step event data must be JSON"):
        log.info("bad", {"when": object()})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="status must be one of"):
        log.sub("x", "done")
    big, long = log.events
    assert isinstance(big.data, dict) and big.data["truncated"] is True
    assert len(long.message) == 2000 and long.message.endswith("…")


def test_current_step_outside_a_step_is_refused() -> None:
    with pytest.raises(RuntimeError, match="outside a step"):
        durably.current_step()


def test_a_handler_called_directly_gets_a_detached_context(uid: str) -> None:
    seen: list[StepContext] = []

    @durably.step(name=f"{uid}.direct")
    def direct(x: int, log: StepContext) -> int:
        seen.append(log)
        log.info("nowhere")
        return x + 1

    assert direct(1) == 2
    assert seen[0].run_id == ""


def test_a_step_context_parameter_before_the_inputs_is_refused(uid: str) -> None:
    with pytest.raises(TypeError, match="must come after the step's inputs"):

        @durably.step(name=f"{uid}.bad")
        def bad(log: StepContext, x: int) -> int:
            return x

    with pytest.raises(TypeError, match="only one parameter"):

        @durably.step(name=f"{uid}.two")
        def two(a: StepContext, *, b: StepContext) -> None:
            return None


async def test_a_step_served_over_a_transport_sends_its_events_back(
    engine_factory: EngineFactory, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = logging.getLogger(f"app.{uid}")
    app.addFilter(durably.RunContextFilter())

    @durably.step(f"{uid}.remote")
    async def remote(x: int, log: StepContext) -> int:
        app.info("served")
        with log.sub_process("work"):
            log.info("inside", {"x": x})
        return x + 1

    @durably.workflow(f"{uid}.wf")
    async def wf(ctx: WorkflowCtx, x: int) -> int:
        return await ctx.step(remote, x)

    caplog.set_level(logging.INFO, logger=f"app.{uid}")
    async with engine_factory(transport=InMemoryTransport(), steps=[remote]) as engine:
        assert await engine.execute(wf, 1, run_id=f"{uid}-r", timeout=RESULT_TIMEOUT) == 2
        [cp] = await engine.list_checkpoints(f"{uid}-r")

    assert cp.kind == "remote" and cp.events is not None
    assert [(e.message, e.status, e.sub_id is not None) for e in cp.events] == [
        ("inside", None, True),
        ("work", "ok", True),
    ]
    [record] = [r for r in caplog.records if r.name == f"app.{uid}"]
    assert (record.__dict__["run_id"], record.__dict__["step"], record.__dict__["seq"]) == (
        f"{uid}-r",
        f"{uid}.remote",
        0,
    )
