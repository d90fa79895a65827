"""onError routing: a failed run handed to a handler workflow by error code.

Only routes of LOCALLY registered workflows apply. Routes announced by remote workers for
workflows they serve without a local registration (and the `run.unrouted` report when
those workers disagree) need remote worker groups, which this engine does not have yet: a
run without a local registration is never routed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from durably._core.log_context import durably_logger
from durably._core.models import (
    HANDOFF_SEQ_BASE,
    RunPatch,
    SignalWaiter,
    StepCheckpoint,
    StepError,
    WorkflowRun,
    utc_from_ms,
)
from durably._engine.control.on_error import (
    ChildStarter,
    handoff_checkpoints,
    handoff_handler_id,
    handoff_name,
    live_handoff,
    on_error_input,
    on_error_run_id,
    route_for,
)
from durably._engine.control.settle import (
    SettleHost,
    release_quietly,
    settle_completed,
    settle_failed_unrouted,
    update_if_live,
)
from durably._engine.defs.events import EngineEvent
from durably._engine.defs.registry import OnErrorRoute, Workflow
from durably._engine.worker.runs import ExecutingRuns

log = durably_logger("durably.worker")


AnnouncedRoutes = Callable[[WorkflowRun], Awaitable[tuple[OnErrorRoute, ...]]]


class Router:
    """Hands failed runs to their onError handlers and follows the handoff on later turns.

    Collaborators: how a run is settled (`settle`), which runs execute here (`runs`),
    the clock and reconcile fallback wake, the workflows registered here, and how a handler
    (a child of the failed run) is started.
    """

    def __init__(
        self,
        settle: SettleHost,
        runs: ExecutingRuns,
        *,
        clock: Callable[[], int],
        fallback_wake_at: Callable[[], int | None],
        registration: Callable[[str, str | None], Workflow[Any, Any] | None],
        workflows: Callable[[], list[Workflow[Any, Any]]],
        start_child: ChildStarter,
    ):
        self._settle = settle
        self._runs = runs
        self._clock = clock
        self._fallback_wake_at = fallback_wake_at
        self._registration = registration
        self._workflows = workflows
        self._start_child = start_child
        self._announced: AnnouncedRoutes | None = None

    def connect(self, announced: AnnouncedRoutes) -> None:
        """Where the routes of a run without a local registration come from: what the live
        workers serving it announce (remote workflows; set once those exist)."""
        self._announced = announced

    def _registered(self, run: WorkflowRun) -> bool:
        return self._registration(run.workflow, run.workflow_version or None) is not None

    def _routes_of(self, run: WorkflowRun) -> tuple[OnErrorRoute, ...]:
        """The routes of the local registration of `workflow@version` (or latest). Routes
        announced by remote workers are not used: there are no remote worker groups yet."""
        wf = self._registration(run.workflow, run.workflow_version) or self._registration(
            run.workflow, None
        )
        return wf.on_error if wf is not None else ()

    async def route_failure(self, run: WorkflowRun, error: StepError) -> bool:
        """Hand the failure to its handler; True when routed
        (the run is then `suspended`, its lease released), False when it fails as usual."""
        routes = self._routes_of(run)
        if not routes and self._announced is not None and not self._registered(run):
            routes = await self._announced(run)
        route = route_for(routes, error)
        if route is None:
            return False
        store = self._settle.store
        # attempt = 1 + handoff rows (live or retired); seq = BASE + attempt - 1.
        attempt = 1 + len(handoff_checkpoints(await store.list_checkpoints(run.id)))
        handler_id = on_error_run_id(run.id, attempt)
        seq = HANDOFF_SEQ_BASE + attempt - 1
        handler_input = on_error_input(run, error)
        # The waiter first, then the placeholder the child wake overwrites.
        await store.put_signal_waiter(
            SignalWaiter(token=f"child:{handler_id}", run_id=run.id, seq=seq)
        )
        at = utc_from_ms(self._clock())
        await store.save_checkpoint(
            StepCheckpoint(
                run_id=run.id,
                seq=seq,
                name=handoff_name(handler_id),
                kind="signal",
                step_id=f"{run.id}:{seq}",
                status="running",
                input={"workflow": route.workflow, "input": handler_input},
                attempts=1,
                enqueued_at=at,
                started_at=at,
                finished_at=at,
            )
        )
        # The turn that failed is over: a completion delivered from now on must start a new
        # turn (which follows the handoff), not wake the closed resident execution.
        ex = self._runs.execution(run.id)
        if ex is not None:
            ex.resident = False
        # `suspended`, reconcile fallback wake, `error` keeps the original failure,
        # lease released. No `run.failed`, no parent notification yet.
        patch: RunPatch = {
            "status": "suspended",
            "error": error,
            "wake_at": self._fallback_wake_at(),
            "locked_by": None,
            "locked_until": None,
        }
        if not await update_if_live(self._settle, run.id, patch):
            # Settled elsewhere meanwhile (cancelled): never resurrect; the handoff row stays
            # as a record, nothing is started.
            await store.remove_signal_waiter(SignalWaiter(f"child:{handler_id}", run.id, seq))
            await release_quietly(self._settle, run.id)
            return True
        self._settle.events.emit(
            EngineEvent(
                type="run.routed",
                run_id=run.id,
                workflow=run.workflow,
                namespace=run.namespace,
                error=error,
                name=route.workflow,  # the handler workflow
            )
        )
        self._settle.wakes.announce_soon("settled", run.id)
        # Deferred start, tagged as the run's child; a failed start is delivered as a failed
        # child completion, as for any child.
        self._start_child(route.workflow, handler_input, handler_id, run, None, run.priority)
        return True

    async def follow_handoff(self, run: WorkflowRun, cps: Sequence[StepCheckpoint]) -> bool:
        """Follow a live handoff at the start of every turn of a routed run, instead of the
        body. True when the turn was consumed (settled or suspended again)."""
        cp = live_handoff(run.id, cps)
        if cp is None:
            return False
        handler_id = handoff_handler_id(run.id, cp)
        assert handler_id is not None
        if cp.status == "completed":
            completion = (
                cp.output if isinstance(cp.output, dict) else {"ok": True, "value": cp.output}
            )
            if completion.get("ok"):
                await settle_completed(self._settle, run, completion.get("value"))
            else:
                failure = StepError(
                    message=str(completion.get("error", "onError handler failed")),
                    code=completion.get("code"),
                    details=completion.get("details"),
                )
                # The handler's failure is final: this settle does NOT route again.
                await settle_failed_unrouted(self._settle, run, failure)
            return True
        handler = await self._settle.store.get_run(handler_id)
        if handler is not None and handler.status == "completed":
            await settle_completed(self._settle, run, handler.output)
            return True
        if handler is not None and handler.status in ("failed", "dead", "cancelled"):
            # failed/dead → its error; cancelled → failed with its error.
            failure = handler.error or StepError(
                message=f"onError handler {handler_id} {handler.status}"
            )
            await settle_failed_unrouted(self._settle, run, failure)
            return True
        if handler is None:
            # The turn that handed off crashed before the deferred start: start it now.
            start = cp.input if isinstance(cp.input, dict) else {}
            workflow = start.get("workflow")
            if isinstance(workflow, str):
                self._start_child(workflow, start.get("input"), handler_id, run, None, run.priority)
        # Stay suspended (reconcile fallback wake); the handler's completion re-drives the run.
        patch: RunPatch = {
            "status": "suspended",
            "wake_at": self._fallback_wake_at(),
            "locked_by": None,
            "locked_until": None,
        }
        if not await update_if_live(self._settle, run.id, patch):
            await release_quietly(self._settle, run.id)
        return True

    def unserved_on_error_routes(self) -> list[dict[str, Any]]:
        """`{workflow, route}` for every route of a
        locally registered workflow whose handler is not registered on this engine. (The
        "served by a live worker group" half needs remote workers: not checked yet.)"""
        unserved: list[dict[str, Any]] = []
        for wf in self._workflows():
            for route in wf.on_error:
                if self._registration(route.workflow, None) is None:
                    unserved.append({"workflow": wf.name, "route": route})
        return unserved

    def warn_unserved(self) -> None:
        """Log a boot-time warning for unserved routes; never raises."""
        try:
            unserved = self.unserved_on_error_routes()
        except Exception:
            log.debug("could not check onError routes", exc_info=True)
            return
        if unserved:
            log.warning(
                "onError handlers not registered on this engine: %s",
                ", ".join(
                    f"{u['workflow']} → {u['route'].workflow}"
                    + (f" (code {u['route'].code})" if u["route"].code else "")
                    for u in unserved
                ),
            )
