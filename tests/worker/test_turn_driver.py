"""`TurnDriver` alone, with fake hosts and the real in-memory store: lease → one turn of the
body → how it ended is settled (or, for a store failure, left unsettled)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from durably._core.errors import ContinueAsNew, FatalError, StoreFailure
from durably._core.models import WorkflowRun
from durably._engine.defs.options import EngineOptions
from durably._engine.defs.registry import Workflow
from durably._engine.run.ctx import WorkflowCtx
from durably._engine.worker.turn_driver import TurnDriver
from durably._store.memory import InMemoryStateStore

from .fakes import INSTANCE, Clock, NoRoutes, RunHost, Runs, Settle, pending_run


class Driven:
    """One driver over one registered workflow `wf`, and everything it was given."""

    def __init__(self, body: Any, *, options: EngineOptions | None = None) -> None:
        self.store = InMemoryStateStore()
        self.settle = Settle(self.store)
        self.runs = Runs()
        self.clock = Clock()
        self.router = NoRoutes()
        self.continued: list[tuple[str, Any, str]] = []
        self.workflow: Workflow[Any, Any] = Workflow(body, "wf", "1")
        host = RunHost(self.settle, self.runs, self.clock, options or EngineOptions())
        self.driver = TurnDriver(
            host,
            self.settle,
            self.runs,
            self.router,
            clock=self.clock,
            lease_ms=30_000,
            instance_id=INSTANCE,
            namespace=None,
            registration=self.registration,
            fallback_wake_at=lambda: None,
            continue_as=self.continue_as,
        )

    def registration(self, name: str, version: str | None) -> Workflow[Any, Any] | None:
        return self.workflow if name == "wf" else None

    async def continue_as(self, run: WorkflowRun, input: Any, run_id: str) -> None:
        self.continued.append((run.id, input, run_id))

    async def turn(self, run_id: str = "r", input: Any = None) -> bool:
        await self.store.create_run(pending_run(run_id, input=input))
        return await self.driver.run_one(run_id)

    async def row(self, run_id: str = "r") -> WorkflowRun:
        run = await self.store.get_run(run_id)
        assert run is not None
        return run

    def events(self, run_id: str = "r") -> list[str]:
        return self.settle.events.types(run_id)


async def test_a_completed_body_is_settled_completed() -> None:
    async def body(ctx: WorkflowCtx, n: int) -> dict[str, int]:
        return {"double": n * 2}

    d = Driven(body)
    assert await d.turn(input=21) is True
    run = await d.row()
    assert (run.status, run.output, run.locked_by) == ("completed", {"double": 42}, None)
    assert d.events() == ["run.started", "run.completed"]
    assert d.runs.began == ["r"] and d.runs.execution("r") is None  # the bracket closed
    assert ("settled", "r") in d.settle.wakes.announced


async def test_a_store_failure_leaves_the_run_unsettled_and_its_lease_free() -> None:
    async def body(ctx: WorkflowCtx) -> None:
        raise StoreFailure(ConnectionError("the database went away"))

    d = Driven(body)
    assert await d.turn() is True
    run = await d.row()
    # Still `running` (recovery resumes it from its last checkpoint), lease given back.
    assert (run.status, run.output, run.error, run.locked_by) == ("running", None, None, None)
    assert d.events() == ["run.started"]
    assert d.router.failures == [] and d.settle.parents == []


async def test_a_failed_body_is_offered_to_routing_then_settled_failed() -> None:
    async def body(ctx: WorkflowCtx) -> None:
        raise FatalError("boom", code="bad_input")

    d = Driven(body)
    await d.turn()
    assert [(run_id, e.code) for run_id, e in d.router.failures] == [("r", "bad_input")]
    run = await d.row()
    assert run.status == "failed" and run.error is not None
    assert (run.error.message, run.error.code) == ("boom", "bad_input")
    assert d.events() == ["run.started", "run.failed"]


async def test_an_output_that_cannot_be_stored_fails_the_run() -> None:
    async def body(ctx: WorkflowCtx) -> Any:
        return object()

    d = Driven(body)
    await d.turn()
    run = await d.row()
    assert run.status == "failed" and run.error is not None
    assert run.error.code == "serialization"


async def test_a_suspended_body_is_settled_suspended_until_its_timer() -> None:
    async def body(ctx: WorkflowCtx) -> None:
        await ctx.sleep(timedelta(minutes=1))

    # Replay mode: the sleep ends the turn instead of parking the body in memory.
    d = Driven(body, options=EngineOptions(always_replay=True))
    await d.turn()
    run = await d.row()
    assert (run.status, run.wake_at, run.locked_by) == ("suspended", d.clock() + 60_000, None)
    assert d.events() == ["run.started", "run.suspended"]


async def test_a_continued_body_completes_and_starts_its_successor() -> None:
    async def body(ctx: WorkflowCtx) -> None:
        raise ContinueAsNew({"round": 2})

    d = Driven(body)
    await d.turn()
    await d.runs.settle()
    run = await d.row()
    assert (run.status, run.output) == ("completed", None)
    assert d.continued == [("r", {"round": 2}, "r~1")]


async def test_a_run_leased_elsewhere_runs_no_turn_here() -> None:
    async def body(ctx: WorkflowCtx) -> None:
        raise AssertionError("never runs")

    d = Driven(body)
    await d.store.create_run(pending_run("r"))
    assert await d.store.claim_run("r", "other", d.clock() + 30_000, d.clock()) is not None
    assert await d.driver.run_one("r") is False
    assert d.runs.began == [] and (await d.row()).locked_by == "other"


async def test_a_draining_driver_leases_nothing() -> None:
    async def body(ctx: WorkflowCtx) -> None:
        raise AssertionError("never runs")

    d = Driven(body)
    d.runs.begin_drain()
    assert await d.turn() is False
    run = await d.row()
    assert (run.status, run.locked_by) == ("pending", None)


async def test_a_settled_run_is_given_back_untouched() -> None:
    async def body(ctx: WorkflowCtx) -> None:
        raise AssertionError("never runs")

    d = Driven(body)
    await d.store.create_run(pending_run("r", status="completed", output=7))
    assert await d.driver.run_one("r") is True
    run = await d.row()
    assert (run.status, run.output, run.locked_by) == ("completed", 7, None)
    assert d.runs.began == [] and d.events() == []
