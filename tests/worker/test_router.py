"""`Router` alone, with fake hosts and the in-memory store: a failed run goes to the handler
whose route matches its error code (the run waits for it), and is settled unrouted
otherwise; a later turn follows the handoff to the handler's outcome."""

from __future__ import annotations

from typing import Any

from durably._core.errors import FatalError
from durably._core.models import HANDOFF_SEQ_BASE, StepError, WorkflowRun
from durably._engine.defs.options import EngineOptions
from durably._engine.defs.registry import OnErrorRoute, Workflow
from durably._engine.run.ctx import WorkflowCtx
from durably._engine.worker.router import Router
from durably._engine.worker.turn_driver import TurnDriver
from durably._store.memory import InMemoryStateStore

from .fakes import INSTANCE, Children, Clock, RunHost, Runs, Settle, pending_run

RECONCILE_MS = 60_000


class Routed:
    """A router over `wf` (routes: code `bad_input` → `fixer`, anything else of code
    `flaky` → `retrier`) and over `plain` (no route)."""

    def __init__(self, body: Any = None) -> None:
        self.store = InMemoryStateStore()
        self.settle = Settle(self.store)
        self.runs = Runs()
        self.clock = Clock()
        self.children = Children()

        async def never(ctx: WorkflowCtx) -> None:
            raise AssertionError("no body runs here")

        routes = [OnErrorRoute("fixer", code="bad_input"), OnErrorRoute("retrier", code="flaky")]
        self.workflows = {
            "wf": Workflow(body or never, "wf", "1", on_error=routes),
            "plain": Workflow(body or never, "plain", "1"),
        }
        self.router = Router(
            self.settle,
            self.runs,
            clock=self.clock,
            fallback_wake_at=lambda: self.clock() + RECONCILE_MS,
            registration=self.registration,
            workflows=lambda: list(self.workflows.values()),
            start_child=self.children,
        )

    def registration(self, name: str, version: str | None) -> Workflow[Any, Any] | None:
        return self.workflows.get(name)

    async def leased(self, run_id: str = "r", workflow: str = "wf") -> WorkflowRun:
        await self.store.create_run(pending_run(run_id, workflow, input={"n": 1}))
        run = await self.store.claim_run(run_id, INSTANCE, self.clock() + 30_000, self.clock())
        assert run is not None
        await self.store.update_run(run_id, {"status": "running"})
        running = await self.store.get_run(run_id)
        assert running is not None
        return running

    async def row(self, run_id: str = "r") -> WorkflowRun:
        run = await self.store.get_run(run_id)
        assert run is not None
        return run


async def test_a_failure_goes_to_the_handler_whose_route_matches_its_code() -> None:
    r = Routed()
    run = await r.leased()
    error = StepError(message="bad", code="bad_input")
    assert await r.router.route_failure(run, error) is True
    # The handler is started as the run's child, given the failure.
    [(handler, handler_input, child_id, parent)] = r.children.started
    assert (handler, child_id, parent) == ("fixer", "r.onError.1", "r")
    assert handler_input["runId"] == "r" and handler_input["error"]["code"] == "bad_input"
    # The run waits for it: suspended (reconcile wake), its error kept, its lease free.
    row = await r.row()
    assert (row.status, row.locked_by) == ("suspended", None)
    assert row.wake_at == r.clock() + RECONCILE_MS
    assert row.error is not None and row.error.code == "bad_input"
    handoff = await r.store.get_checkpoint("r", HANDOFF_SEQ_BASE)
    assert handoff is not None and handoff.status == "running"
    assert r.settle.events.types("r") == ["run.routed"]


async def test_a_failure_no_route_matches_is_not_routed() -> None:
    r = Routed()
    run = await r.leased()
    assert await r.router.route_failure(run, StepError(message="x", code="other")) is False
    assert await r.router.route_failure(run, StepError(message="x")) is False  # no code
    plain = await r.leased("p", "plain")
    assert await r.router.route_failure(plain, StepError(message="x", code="bad_input")) is False
    assert r.children.started == [] and r.settle.events.emitted == []
    assert (await r.row()).status == "running"
    assert await r.store.list_checkpoints("r") == []


async def test_a_driven_failure_is_routed_or_settled_unrouted_by_its_code() -> None:
    async def body(ctx: WorkflowCtx, code: str) -> None:
        raise FatalError("failed", code=code)

    r = Routed(body)
    driver = TurnDriver(
        RunHost(r.settle, r.runs, r.clock, EngineOptions()),
        r.settle,
        r.runs,
        r.router,
        clock=r.clock,
        lease_ms=30_000,
        instance_id=INSTANCE,
        namespace=None,
        registration=r.registration,
        fallback_wake_at=lambda: None,
        continue_as=lambda run, input, run_id: _never(),
    )
    await r.store.create_run(pending_run("routed", input="flaky"))
    await r.store.create_run(pending_run("unrouted", input="other"))
    await driver.run_one("routed")
    await driver.run_one("unrouted")
    assert [(h, c) for h, _, c, _ in r.children.started] == [("retrier", "routed.onError.1")]
    assert (await r.row("routed")).status == "suspended"
    unrouted = await r.row("unrouted")
    assert unrouted.status == "failed" and unrouted.error is not None
    assert unrouted.error.code == "other"
    assert r.settle.events.types("unrouted") == ["run.started", "run.failed"]


async def test_the_handoff_settles_the_run_with_its_handlers_outcome() -> None:
    r = Routed()
    ok, failed = await r.leased("ok"), await r.leased("bad")
    for run in (ok, failed):
        assert await r.router.route_failure(run, StepError(message="x", code="bad_input"))
    # The handlers finish (written as their runs, as another process would have them).
    await r.store.create_run(
        pending_run("ok.onError.1", "fixer", status="completed", output={"fixed": True})
    )
    await r.store.create_run(
        pending_run(
            "bad.onError.1",
            "fixer",
            status="failed",
            error=StepError(message="could not fix", code="unfixable"),
        )
    )
    for run_id in ("ok", "bad"):
        cps = await r.store.list_checkpoints(run_id)
        assert await r.router.follow_handoff(await r.row(run_id), cps) is True
    done = await r.row("ok")
    assert (done.status, done.output) == ("completed", {"fixed": True})
    given_up = await r.row("bad")
    assert given_up.status == "failed" and given_up.error is not None
    # The handler's failure is final: it is never routed again.
    assert (given_up.error.code, len(r.children.started)) == ("unfixable", 2)


async def test_a_handoff_whose_handler_never_started_starts_it_and_waits() -> None:
    r = Routed()
    run = await r.leased()
    assert await r.router.route_failure(run, StepError(message="x", code="bad_input"))
    r.children.started.clear()  # the deferred start was lost with the process
    cps = await r.store.list_checkpoints("r")
    assert await r.router.follow_handoff(await r.row(), cps) is True
    assert [(h, c) for h, _, c, _ in r.children.started] == [("fixer", "r.onError.1")]
    assert (await r.row()).status == "suspended"


def test_routes_whose_handler_is_not_registered_are_listed() -> None:
    r = Routed()
    unserved = {(u["workflow"], u["route"].workflow) for u in r.router.unserved_on_error_routes()}
    assert unserved == {("wf", "fixer"), ("wf", "retrier")}
    r.workflows["fixer"] = Workflow(_fixer, "fixer", "1")
    unserved = {(u["workflow"], u["route"].workflow) for u in r.router.unserved_on_error_routes()}
    assert unserved == {("wf", "retrier")}


async def _fixer(ctx: WorkflowCtx) -> None:
    return None


async def _never() -> None:
    raise AssertionError("no run continues here")
