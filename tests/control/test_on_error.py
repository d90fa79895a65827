"""onError routing: handoff, follow, retry, events and unserved routes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

import durably
from durably import (
    EngineEvent,
    FatalError,
    OnErrorInput,
    OnErrorRoute,
    RunFailedError,
    StepError,
    WorkflowCtx,
    WorkflowRun,
)
from durably._core.models import HANDOFF_SEQ_BASE
from durably._engine.control.on_error import route_for
from tests.engine_support import (
    FAST_TUNING,
    RESULT_TIMEOUT,
    EngineFactory,
    bump,
    wait_status,
    wait_until,
)


def test_route_for_exact_code_catch_all_and_non_determinism() -> None:
    declined = OnErrorRoute(workflow="h.declined", code="declined")
    catch_all = OnErrorRoute(workflow="h.any")
    routes = [declined, catch_all]
    assert route_for(routes, StepError("x", code="declined")) is declined
    assert route_for(routes, StepError("x", code="timeout")) is catch_all
    assert route_for(routes, StepError("x")) is catch_all
    # A broken deploy is never routed, even by a catch-all or exact route.
    assert route_for(routes, StepError("x", code="non_determinism")) is None
    nd = [OnErrorRoute(workflow="h", code="non_determinism")]
    assert route_for(nd, StepError("x", code="non_determinism")) is None
    assert route_for([], StepError("x", code="declined")) is None
    assert route_for([declined], StepError("x", code="other")) is None


def test_on_error_input_json_round_trip_keeps_the_camel_case_shape() -> None:
    stored = {
        "runId": "r",
        "workflow": "w",
        "input": [1],
        "error": {"message": "m", "code": "c", "details": {"cardLast4": "4242"}},
    }
    value = OnErrorInput.from_json(stored)
    error = StepError("m", code="c", details={"cardLast4": "4242"})
    assert value == OnErrorInput(run_id="r", workflow="w", input=[1], error=error)
    assert value.to_json() == stored
    with pytest.raises(ValueError, match="error must be an object"):
        OnErrorInput.from_json({**stored, "error": "m"})


async def test_handler_reads_the_failure_as_a_typed_error(
    engine_factory: EngineFactory, uid: str
) -> None:
    """The handler's `inp.error` is the typed StepError that `run.error` holds, also when
    the handler body is replayed from its stored input; that stored input stays the
    camelCase JSON it always was."""
    reads: list[tuple[Any, ...]] = []

    @durably.step(f"{uid}.note")
    def note(text: str) -> str:
        return text

    def read(inp: OnErrorInput) -> tuple[Any, ...]:
        error = inp.error
        return (type(error), error.message, error.code, error.details, error.retryable)

    @durably.workflow(f"{uid}.handler")
    async def handler(ctx: WorkflowCtx, inp: OnErrorInput) -> dict[str, Any]:
        reads.append(read(inp))
        # In replay mode the body is evicted after this step and replayed from the stored
        # input, so the second read below comes from a rebuilt OnErrorInput.
        await ctx.step(note, inp.error.code or "")
        reads.append(read(inp))
        return {"code": inp.error.code, "message": inp.error.message}

    @durably.workflow(f"{uid}.wf", on_error=[OnErrorRoute(workflow=f"{uid}.handler")])
    async def wf(ctx: WorkflowCtx, order: dict[str, Any]) -> None:
        raise FatalError("card declined", code="declined", details={"cardLast4": "4242"})

    async with engine_factory() as engine:
        handle = await engine.start(wf, {"orderId": 7}, run_id=f"{uid}-r")
        out = await handle.result(timeout=RESULT_TIMEOUT)
        handler_run = await engine.get_run(f"{uid}-r.onError.1")

    assert out == {"code": "declined", "message": "card declined"}
    expected = (StepError, "card declined", "declined", {"cardLast4": "4242"}, False)
    assert reads and all(r == expected for r in reads), reads
    assert handler_run is not None
    stored = dict(handler_run.input)
    error = dict(stored.pop("error"))
    assert stored == {"runId": f"{uid}-r", "workflow": f"{uid}.wf", "input": {"orderId": 7}}
    assert isinstance(error.pop("stack", ""), str)
    assert error == {
        "message": "card declined",
        "code": "declined",
        "details": {"cardLast4": "4242"},
        "retryable": False,
    }


async def test_code_route_completes_the_run_with_the_handlers_output(
    engine_factory: EngineFactory, uid: str
) -> None:
    seen: list[Any] = []
    counts: dict[str, int] = {}

    @durably.workflow(f"{uid}.handler")
    async def handler(ctx: WorkflowCtx, failure: OnErrorInput) -> dict[str, Any]:
        seen.append(failure)
        return {"recovered": failure.input["order"]}

    @durably.workflow(f"{uid}.any")
    async def any_handler(ctx: WorkflowCtx, failure: Any) -> str:
        return "catch-all"

    @durably.workflow(
        f"{uid}.checkout",
        on_error=[
            OnErrorRoute(workflow=f"{uid}.handler", code="declined"),
            OnErrorRoute(workflow=f"{uid}.any"),
        ],
    )
    async def checkout(ctx: WorkflowCtx, order: dict[str, Any]) -> Any:
        bump(counts, "body")
        raise FatalError("card declined", code="declined", details={"card": "4242"})

    events: list[EngineEvent] = []
    async with engine_factory() as engine:
        engine.subscribe(events.append)
        handle = await engine.start(checkout, {"order": 7}, run_id=f"{uid}-r")
        assert await handle.result(timeout=RESULT_TIMEOUT) == {"recovered": 7}
        run_id = handle.run_id
        handler_run = await engine.get_run(f"{run_id}.onError.1")
        cps = await engine.list_checkpoints(run_id)
        children = await engine.get_run_children(run_id)
        metrics = engine.metrics()

    assert counts == {"body": 1}  # the body is never re-run by the routed turns
    assert len(seen) == 1
    got = seen[0]
    assert (got.run_id, got.workflow, got.input) == (run_id, f"{uid}.checkout", {"order": 7})
    assert got.error.message == "card declined"
    assert got.error.code == "declined" and got.error.details == {"card": "4242"}
    assert handler_run is not None and handler_run.status == "completed"
    assert handler_run.input["runId"] == run_id
    handoff = [cp for cp in cps if cp.seq >= HANDOFF_SEQ_BASE]
    assert [(cp.seq, cp.name, cp.status) for cp in handoff] == [
        (HANDOFF_SEQ_BASE, f"signal:child:{run_id}.onError.1", "completed")
    ]
    assert f"{run_id}.onError.1" in children
    routed = [e for e in events if e.type == "run.routed"]
    assert len(routed) == 1 and routed[0].name == f"{uid}.handler"
    assert routed[0].error is not None and routed[0].error.code == "declined"
    assert not [e for e in events if e.type == "run.failed" and e.run_id == run_id]
    assert metrics.runs["routed"] == 1
    assert metrics.routed_by_code == {"declined": 1}


async def test_handler_failure_fails_the_run_without_routing_again(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.workflow(f"{uid}.handler")
    async def handler(ctx: WorkflowCtx, failure: dict[str, Any]) -> None:
        raise FatalError("handler gave up", code="gave_up", details={"of": failure["runId"]})

    @durably.workflow(f"{uid}.wf", on_error=[OnErrorRoute(workflow=f"{uid}.handler")])
    async def wf(ctx: WorkflowCtx) -> None:
        raise FatalError("boom")  # no code → catch-all

    async with engine_factory() as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        cps = await engine.list_checkpoints(handle.run_id)
        metrics = engine.metrics()

    error = info.value.error
    assert error is not None
    assert (error.message, error.code, error.details) == (
        "handler gave up",
        "gave_up",
        {"of": f"{uid}-r"},
    )
    assert len([cp for cp in cps if cp.seq >= HANDOFF_SEQ_BASE]) == 1
    assert metrics.runs["routed"] == 1 and metrics.routed_by_code == {"*": 1}


async def test_no_matching_route_fails_as_usual(engine_factory: EngineFactory, uid: str) -> None:
    @durably.workflow(f"{uid}.handler")
    async def handler(ctx: WorkflowCtx, failure: Any) -> str:
        return "handled"

    @durably.workflow(
        f"{uid}.wf", on_error=[OnErrorRoute(workflow=f"{uid}.handler", code="declined")]
    )
    async def wf(ctx: WorkflowCtx) -> None:
        raise FatalError("other", code="other")

    async with engine_factory() as engine:
        handle = await engine.start(wf)
        with pytest.raises(RunFailedError) as info:
            await handle.result(timeout=RESULT_TIMEOUT)
        assert await engine.get_run(f"{handle.run_id}.onError.1") is None
        assert engine.metrics().runs["routed"] == 0
    assert info.value.error is not None and info.value.error.code == "other"


async def test_requeue_retires_the_handoff_and_routes_to_the_next_attempt(
    engine_factory: EngineFactory, uid: str
) -> None:
    counts: dict[str, int] = {}

    @durably.workflow(f"{uid}.handler")
    async def handler(ctx: WorkflowCtx, failure: OnErrorInput) -> str:
        if bump(counts, "handler") == 1:
            raise FatalError("not this time")
        return f"handled {failure.run_id}"

    @durably.workflow(f"{uid}.wf", on_error=[OnErrorRoute(workflow=f"{uid}.handler")])
    async def wf(ctx: WorkflowCtx) -> None:
        bump(counts, "body")
        raise FatalError("boom", code="x")

    async with engine_factory() as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        run_id = handle.run_id
        with pytest.raises(RunFailedError):
            await handle.result(timeout=RESULT_TIMEOUT)
        await engine.retry(run_id)
        assert await handle.result(timeout=RESULT_TIMEOUT) == f"handled {run_id}"
        cps = await engine.list_checkpoints(run_id)
        second = await engine.get_run(f"{run_id}.onError.2")

    assert counts == {"body": 2, "handler": 2}
    assert second is not None and second.status == "completed"
    assert [(cp.seq, cp.name, cp.status) for cp in cps if cp.seq >= HANDOFF_SEQ_BASE] == [
        (HANDOFF_SEQ_BASE, f"handoff:retired:{run_id}.onError.1", "completed"),
        (HANDOFF_SEQ_BASE + 1, f"signal:child:{run_id}.onError.2", "completed"),
    ]


class _StallingStore:
    """A store whose write of one run never returns (the writing process is dying): the
    call hangs until the engine closes and cancels it, and nothing is written."""

    def __init__(self, inner: Any, stall: str) -> None:
        self._inner = inner
        self._stall = stall
        self.stalled: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def _hang(self, run_id: str) -> None:
        self.stalled.append(run_id)
        await asyncio.Event().wait()

    async def create_run(self, run: WorkflowRun) -> None:
        if run.id == self._stall:
            await self._hang(run.id)
        await self._inner.create_run(run)

    async def create_runs(self, runs: Sequence[WorkflowRun]) -> list[str | None]:
        if any(run.id == self._stall for run in runs):
            await self._hang(self._stall)
        result: list[str | None] = await self._inner.create_runs(runs)
        return result


async def test_crash_between_handoff_and_handler_start(
    engine_factory: EngineFactory, uid: str
) -> None:
    """The process that handed off dies before its deferred handler start ran: the next
    wake of the routed run (here: its reconcile fallback, on a new engine) starts it."""

    @durably.workflow(f"{uid}.handler")
    async def handler(ctx: WorkflowCtx, failure: OnErrorInput) -> str:
        return f"late {failure.error.code}"

    @durably.workflow(f"{uid}.wf", on_error=[OnErrorRoute(workflow=f"{uid}.handler")])
    async def wf(ctx: WorkflowCtx) -> None:
        raise FatalError("boom", code="c")

    # The crash: the first process's write of the handler run never lands (the process dies
    # during it; closing the engine cancels the call).
    lender = engine_factory(reconcile_ms=150)  # never opened: lends its store
    store = _StallingStore(lender.store, f"{uid}-r.onError.1")
    tuning = {**FAST_TUNING, "always_replay": engine_factory.replay, "reconcile_ms": 150}
    try:
        async with durably.Engine(store, **tuning) as engine:
            handle = await engine.start(wf, run_id=f"{uid}-r")
            run = await wait_status(engine, handle.run_id, "suspended")
            assert run.error is not None and run.error.code == "c"  # keeps the original failure

            async def handler_start_began() -> bool:
                return store.stalled == [f"{uid}-r.onError.1"]

            await wait_until(handler_start_began)
            assert await engine.get_run(f"{uid}-r.onError.1") is None
    finally:
        await lender.close()
    async with engine_factory(reconcile_ms=150) as engine:
        assert await engine.get_handle(f"{uid}-r").result(timeout=RESULT_TIMEOUT) == "late c"
        handler_run = await engine.get_run(f"{uid}-r.onError.1")
    assert handler_run is not None and handler_run.status == "completed"


async def test_unserved_routes_are_reported_and_logged(
    engine_factory: EngineFactory, uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    @durably.workflow(f"{uid}.served")
    async def served(ctx: WorkflowCtx, failure: Any) -> None:
        return None

    routes = [
        OnErrorRoute(workflow=f"{uid}.served", code="a"),
        OnErrorRoute(workflow=f"{uid}.missing"),
    ]

    @durably.workflow(f"{uid}.wf", on_error=routes)
    async def wf(ctx: WorkflowCtx) -> None:
        return None

    caplog.set_level(logging.WARNING, logger="durably")
    async with engine_factory(workflows=[wf, served]) as engine:
        unserved = await engine.unserved_on_error_routes()
    assert unserved == [{"workflow": f"{uid}.wf", "route": routes[1]}]
    assert f"{uid}.missing" in caplog.text


async def test_cancelling_a_routed_run_cancels_its_handler(
    engine_factory: EngineFactory, uid: str
) -> None:
    @durably.workflow(f"{uid}.handler")
    async def handler(ctx: WorkflowCtx, failure: Any) -> Any:
        return await ctx.wait_for_signal(f"{uid}.never")

    @durably.workflow(f"{uid}.wf", on_error=[OnErrorRoute(workflow=f"{uid}.handler")])
    async def wf(ctx: WorkflowCtx) -> None:
        raise FatalError("boom")

    async with engine_factory() as engine:
        handle = await engine.start(wf, run_id=f"{uid}-r")
        await wait_status(engine, f"{uid}-r.onError.1", "suspended")
        assert await engine.get_run_children(handle.run_id) == [f"{uid}-r.onError.1"]
        await engine.cancel(handle.run_id)
        handler_run = await wait_status(engine, f"{uid}-r.onError.1", "cancelled")
        run = await engine.get_run(handle.run_id)
    assert handler_run.status == "cancelled"
    assert run is not None and run.status == "cancelled"
