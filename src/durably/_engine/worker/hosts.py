"""The roles the worker runtime plays for the parts it drives, one small object each.

A run executing here, a settle, the control plane and the remote turns each see the worker
through a protocol of their own. The worker builds one object per role and hands it to
whoever needs that role, instead of being all of them itself:

- `Registrations`: the workflows and steps registered here;
- `RunStarts`: runs started from inside the runtime (children, continuations, an event's
  subscribers, runs served by remote workflow workers);
- `Settling` (`saga.CancelHost`, hence `settle.SettleHost`): how a turn, a route, the poller
  and the remote turns settle runs;
- `LocalHooks` (`plane.LocalRuns`): what a control-plane operation adds when this process
  drives runs;
- `ExecutionHost` (`run.host.RunHost`): what a run executing here sees.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from durably._core.errors import WorkflowNotFoundError
from durably._core.log_context import durably_logger
from durably._core.models import JSONValue, RunResult, StepCheckpoint, StepError, WorkflowRun
from durably._engine.client.client import plain_input
from durably._engine.client.client import prepare_input as validated_input
from durably._engine.control.fleet_check import FleetCheck, unserved_message
from durably._engine.control.operator import cancel as cancel_run
from durably._engine.control.operator import current_task
from durably._engine.control.plane import ControlPlane
from durably._engine.control.settle import run_event
from durably._engine.control.signals import CompletionMailbox, SignalRoute
from durably._engine.control.start import StartRequest
from durably._engine.defs.events import EventBus
from durably._engine.defs.intercept import NO_INTERCEPTORS, Interceptors
from durably._engine.defs.registry import (
    DEFAULT_REGISTRY,
    Registry,
    Step,
    Workflow,
    close_matches,
)
from durably._engine.defs.vocab import parent_tag
from durably._engine.triggers import publish
from durably._engine.worker.runs import BackgroundTasks, ExecutingRuns, Redispatch

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from durably._engine.defs.options import EngineOptions
    from durably._engine.run.host import RemoteDispatch, StepAdmission, StepTransport
    from durably._engine.run.resident import ResidentSet
    from durably._store.protocol import StateStore

log = durably_logger("durably.worker")

__all__ = [
    "ExecutionHost",
    "Listeners",
    "LocalHooks",
    "Registrations",
    "RunStarts",
    "Settling",
]

T = TypeVar("T")


class Listeners(Generic[T]):
    """Callbacks told of something (a run gone dead, a run cancelled); one that raises is
    logged and the others are still told."""

    def __init__(self, what: str):
        self._what = what
        self._listeners: list[Callable[[T], Any]] = []

    def add(self, listener: Callable[[T], Any]) -> Callable[[], None]:
        """Add a listener; the callable returned removes it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def fire(self, value: T) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(value)
            except Exception:
                log.exception("%s listener failed", self._what)


# ---------------------------------------------------------------------- what the roles use


class Wakes(Protocol):
    """This process's end of the wake bus (`WakeLink`)."""

    async def announce(self, kind: str, run_id: str) -> None: ...

    def announce_soon(self, kind: str, run_id: str) -> None: ...

    def kick(self) -> None: ...


class ParentNotice(Protocol):
    """How a finished run's completion reaches its parent (`Deliveries`)."""

    def notify_parent(self, run: WorkflowRun | str, completion: dict[str, Any]) -> None: ...


class Redrive(ParentNotice, Protocol):
    """Waking a run after something it waits for happened, and telling parents (`Deliveries`)."""

    async def redrive(self, run_id: str, cp: StepCheckpoint | None = None) -> None: ...


class EventRoute(SignalRoute, ParentNotice, Protocol):
    """The signal path an event is published on, which also tells parents (`Deliveries`)."""


class RemoteStarts(Protocol):
    """Starting runs of workflows that remote workflow workers serve (`RemoteTurns`)."""

    def start_child_soon(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        child_id: str,
        parent: WorkflowRun,
        version: str | None,
        priority: int | None,
    ) -> None: ...

    async def serves_workflow(self, workflow: str, namespace: str | None) -> bool: ...


class CancelBroadcast(Protocol):
    """Telling the workers that run a run's steps that it was cancelled (`FleetLink`)."""

    async def broadcast_cancel(self, run_id: str) -> None: ...


class LocalRunsHere(ExecutingRuns, Redispatch, BackgroundTasks, Protocol):
    """What the control plane's local hooks ask of the runs here (the `Dispatcher`)."""

    @property
    def drive_runs(self) -> bool: ...

    @property
    def load(self) -> int: ...

    def mark_fresh(self, run_id: str) -> None: ...


class HostedRuns(BackgroundTasks, Protocol):
    """What a run executing here asks of the runs here (the `Dispatcher`)."""

    @property
    def drive_runs(self) -> bool: ...

    def mark_fresh(self, run_id: str) -> None: ...


class ClaimQueue(Protocol):
    """Runs this process created, to claim by id at the next pick-up (the `Poller`)."""

    def queue_claim(self, run_id: str) -> None: ...


# ---------------------------------------------------------------------- the roles


class Registrations:
    """The workflows and steps registered in this worker."""

    def __init__(self, workflows: Registry, steps: Registry | None):
        self._workflows = workflows
        self._steps = steps

    @property
    def none_given(self) -> bool:
        """`workflows=[]` was given: an explicit registry holding no workflow."""
        return self._workflows is not DEFAULT_REGISTRY and not self._workflows.workflows

    def served_steps(self) -> list[str]:
        """The names of the steps this worker serves (`steps=`, else every decorated one)."""
        registry = self._steps if self._steps is not None else DEFAULT_REGISTRY
        return list(registry.steps)

    def register(self, item: Workflow[Any, Any] | Step[Any, Any]) -> None:
        if isinstance(item, Workflow):
            self._workflows.add_workflow(item)
        else:
            if self._steps is None:
                self._steps = Registry()
            self._steps.add_step(item)

    def registration(self, name: str, version: str | None = None) -> Workflow[Any, Any] | None:
        return self._workflows.workflow(name, version)

    def registered_workflows(self) -> list[Workflow[Any, Any]]:
        return list(self._workflows.workflows.values())

    def latest_workflows(self) -> list[Workflow[Any, Any]]:
        return list(self._workflows.latest.values())

    def step_definition(self, name: str) -> Step[Any, Any] | None:
        if self._steps is not None:
            found = self._steps.step(name)
            if found is not None:
                return found
        return DEFAULT_REGISTRY.step(name)

    def resolve(
        self, workflow: Workflow[Any, Any] | str, version: str | None
    ) -> Workflow[Any, Any]:
        name = workflow.name if isinstance(workflow, Workflow) else str(workflow)
        if isinstance(workflow, Workflow) and version is None:
            version = workflow.version
            if self.registration(name, version) is None:
                self.register(workflow)
        found = self.registration(name, version)
        if found is not None:
            return found
        versions = self._workflows.versions_of(name)
        if version is not None:
            raise WorkflowNotFoundError(
                f"workflow {name}@{version} is not registered — a pinned start never falls "
                f"back to another version (registered: {', '.join(versions) or 'none'})"
            )
        raise WorkflowNotFoundError(
            f"workflow {name} is not registered{close_matches(name, self._workflows.latest)}"
        )

    def prepare_input(self, workflow: Workflow[Any, Any], input: Any) -> JSONValue:
        """Validate a start input against the workflow's annotation/validator → JSON."""
        return validated_input(workflow, input)


class RunStarts:
    """Runs started from inside the runtime: children (a failed start fails the awaiting
    parent), continuations, an event's subscribers, and runs of workflows registered
    nowhere here but served by live workflow workers."""

    def __init__(
        self,
        plane: ControlPlane,
        registrations: Registrations,
        deliveries: EventRoute,
        tasks: BackgroundTasks,
        *,
        clock: Callable[[], int],
        namespace: str | None,
        instance_id: str,
    ):
        self._plane = plane
        self._fleet = FleetCheck(plane.store)
        self._instance_id = instance_id
        self._registrations = registrations
        self._deliveries = deliveries
        self._tasks = tasks
        self._clock = clock
        self._namespace = namespace
        self._remote: RemoteStarts | None = None

    def connect(self, remote: RemoteStarts) -> None:
        """Remote workflow turns, once they exist (they start registered children here)."""
        self._remote = remote

    async def create_run(
        self, wf: Workflow[Any, Any], json_input: JSONValue, request: StartRequest
    ) -> str:
        return await self._plane.create_run(request, json_input, registered=wf)

    def start_child_soon(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        child_id: str,
        parent: WorkflowRun,
        version: str | None,
        priority: int | None,
    ) -> None:
        """Start a child run after the current turn; a failed start fails the awaiting
        parent (delivered as a failed child completion). A child not registered here may be
        a remote workflow (served by inheritance or by convention): remote turns start it."""
        if self._remote is not None:
            self._remote.start_child_soon(workflow, input, child_id, parent, version, priority)
            return
        self.start_registered_child(workflow, input, child_id, parent, version, priority)

    def start_registered_child(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        child_id: str,
        parent: WorkflowRun,
        version: str | None,
        priority: int | None,
    ) -> None:
        registrations = self._registrations

        async def start_child() -> None:
            name = workflow.name if isinstance(workflow, Workflow) else workflow
            try:
                wf = registrations.resolve(workflow, version)
                request = StartRequest(
                    workflow=wf.name,
                    run_id=child_id,
                    tags=(parent_tag(parent.id),),
                    namespace=parent.namespace,
                    priority=priority,
                )
                await self.create_run(wf, registrations.prepare_input(wf, input), request)
            except Exception as exc:
                self._deliveries.notify_parent(
                    child_id,
                    {"ok": False, "error": f'child workflow "{name}" failed to start: {exc}'},
                )

        self._tasks.spawn(start_child())

    async def continue_as(self, run: WorkflowRun, input: Any, run_id: str) -> None:
        """ContinueAsNew's successor: the same workflow, newest version, same tags and
        priority (a continuation is the same logical run, so it keeps its place)."""
        wf = self._registrations.resolve(run.workflow, None)
        request = StartRequest(
            workflow=wf.name,
            run_id=run_id,
            tags=tuple(run.tags or ()),
            priority=run.priority,
            namespace=run.namespace,
        )
        await self.create_run(wf, self._registrations.prepare_input(wf, input), request)

    async def publish_event(
        self, name: str, payload: Any = None, *, id: str | None = None, buffer: bool = True
    ) -> int:
        return await publish.publish_event(
            self._deliveries,
            name,
            payload,
            id=id,
            buffer=buffer,
            workflows=self._registrations.latest_workflows(),
            start=self._start_for_event,
            clock=self._clock,
            namespace=self._namespace,
        )

    async def _start_for_event(self, wf: Workflow[Any, Any], payload: Any, run_id: str) -> str:
        request = StartRequest(workflow=wf.name, run_id=run_id)
        return await self.create_run(wf, self._registrations.prepare_input(wf, payload), request)

    async def start_served_elsewhere(self, input: Any, request: StartRequest) -> str:
        """Start a run of a workflow registered nowhere here, by name with its JSON input
        (its first turn pins the version), when the fleet serves it: live workflow workers
        by convention on the transport (unpinned starts), or a live worker's heartbeat row
        (`fleet_check`). `WorkflowNotFoundError` with the close names otherwise.

        With no worker beating, this engine's registry is the only evidence: an engine that
        registers workflows refuses a name it lacks (as it always did); one that registers
        none (`workflows=[]`, a web tier) knows nothing of the app and creates the run, as
        `Client.start` does."""
        name, version = request.workflow, request.version
        ns = request.namespace or self._namespace
        json_input = plain_input(name, input)
        if (
            version is None
            and self._remote is not None
            and await self._remote.serves_workflow(name, ns)
        ):
            return await self._plane.create_run(request, json_input)
        view = await self._fleet.view(ns)
        known = [wf.name for wf in self._registrations.latest_workflows()]
        if (
            view.serves(name, version, ns)
            or (not view.visible and not known)
            or await self._fleet.names_existing_run(request.run_id)
        ):
            return await self._plane.create_run(request, json_input)
        if all(beat.instance_id == self._instance_id for beat in view.beats):
            # Only this engine beats, or none: its registry's own refusal says it best.
            self._registrations.resolve(name, version)
        raise WorkflowNotFoundError(unserved_message(name, version, ns, view, known=known))


class Settling:
    """How runs are settled here (`saga.CancelHost`): the store, where run events go, the
    wake bus, a finished run's parent, and the `on_cancel` listeners."""

    def __init__(
        self,
        store: StateStore,
        events: EventBus,
        wakes: Wakes,
        parents: ParentNotice,
        cancelled: Listeners[str],
    ):
        self._store = store
        self._events = events
        self._wakes = wakes
        self._parents = parents
        self._cancelled = cancelled

    @property
    def store(self) -> StateStore:
        return self._store

    @property
    def events(self) -> EventBus:
        return self._events

    @property
    def wakes(self) -> Wakes:
        return self._wakes

    def notify_parent(self, run: WorkflowRun | str, completion: dict[str, Any]) -> None:
        self._parents.notify_parent(run, completion)

    def fire_cancel(self, run_id: str) -> None:
        self._cancelled.fire(run_id)


class LocalHooks:
    """What a control-plane operation adds when this process drives runs (`plane.LocalRuns`):
    drive a run created here at once (room permitting), wake, interrupt or stop a run
    executing here, and tell local listeners of a cancel."""

    def __init__(
        self,
        runs: LocalRunsHere,
        registrations: Registrations,
        wakes: Wakes,
        deliveries: Redrive,
        events: EventBus,
        cancelled: Listeners[str],
        *,
        max_concurrent_runs: int,
        fleet: CancelBroadcast | None,
    ):
        self._runs = runs
        self._registrations = registrations
        self._wakes = wakes
        self._deliveries = deliveries
        self._events = events
        self._cancelled = cancelled
        self._max_concurrent_runs = max_concurrent_runs
        self._fleet = fleet

    def registration(self, name: str, version: str | None = None) -> Workflow[Any, Any] | None:
        return self._registrations.registration(name, version)

    async def run_created(self, run_id: str) -> None:
        runs = self._runs
        if not runs.drive_runs:
            await self._wakes.announce("ready", run_id)
        elif runs.load < self._max_concurrent_runs:
            runs.mark_fresh(run_id)  # no checkpoints to read on its first turn
            runs.dispatch(run_id)
        else:
            # Full: the run waits in the pending backlog like one created elsewhere (picked
            # up by priority, then age, when a turn ends), so a burst of starts cannot drive
            # more than `max_concurrent_runs` runs here.
            self._wakes.kick()

    def run_ready(self, run_id: str) -> None:
        self._runs.dispatch(run_id)

    async def redrive(self, run_id: str, cp: StepCheckpoint | None) -> None:
        await self._deliveries.redrive(run_id, cp)

    def request_cancel(self, run_id: str) -> bool:
        execution = self._runs.execution(run_id)
        if execution is None:
            return False
        # A resident turn: end its waits (RunEvicted → the exit runs the unwind); a turn
        # mid-step reaches its next exit non-resident.
        execution.cancel_requested = True
        execution.evict()
        return True

    def stop(self, run_id: str) -> None:
        execution = self._runs.execution(run_id)
        if execution is None:
            return
        execution.cancelled = True
        execution.evict()
        # Never cancel the task asking for it (a run cancelling itself through a step).
        if execution.task is not None and execution.task is not current_task():
            execution.task.cancel()

    def run_cancelled(self, run: WorkflowRun, error: StepError) -> None:
        # `reason` marks the cancel: an execution timeout cancels with an error of its own.
        self._events.emit(run_event("run.failed", run, error=error, reason="cancelled"))
        self._cancelled.fire(run.id)
        if self._fleet is not None:
            self._runs.spawn(self._fleet.broadcast_cancel(run.id))

    def notify_parent(self, run: WorkflowRun, completion: dict[str, Any]) -> None:
        self._deliveries.notify_parent(run, completion)


class ExecutionHost:
    """What a run executing here sees of the runtime (`run.host.RunHost`)."""

    def __init__(
        self,
        *,
        store: StateStore,
        options: EngineOptions,
        events: EventBus,
        resident: ResidentSet,
        transport: StepTransport,
        remote: RemoteDispatch | None,
        capabilities: Sequence[str] = (),
        wakes: Wakes,
        flow: StepAdmission,
        namespace: str | None,
        instance_id: str,
        executor: Callable[[], ThreadPoolExecutor],
        clock: Callable[[], int],
        fallback_wake_at: Callable[[], int | None],
        registrations: Registrations,
        starts: RunStarts,
        plane: ControlPlane,
        runs: HostedRuns,
        claims: ClaimQueue,
        mailbox: CompletionMailbox,
        interceptors: Interceptors = NO_INTERCEPTORS,
    ):
        self._store = store
        self._interceptors = interceptors
        self._options = options
        self._events = events
        self._resident = resident
        self._transport = transport
        self._remote = remote
        self._capabilities = tuple(dict.fromkeys(capabilities))
        self._wakes = wakes
        self._flow = flow
        self._namespace = namespace
        self._instance_id = instance_id
        self._executor = executor
        self._clock = clock
        self._fallback_wake_at = fallback_wake_at
        self._registrations = registrations
        self._starts = starts
        self._plane = plane
        self._runs = runs
        self._claims = claims
        self._mailbox = mailbox

    @property
    def store(self) -> StateStore:
        return self._store

    @property
    def options(self) -> EngineOptions:
        return self._options

    @property
    def events(self) -> EventBus:
        return self._events

    @property
    def resident(self) -> ResidentSet:
        return self._resident

    @property
    def interceptors(self) -> Interceptors:
        return self._interceptors

    @property
    def transport(self) -> StepTransport:
        return self._transport

    @property
    def remote(self) -> RemoteDispatch | None:
        return self._remote

    @property
    def capabilities(self) -> tuple[str, ...]:
        return self._capabilities

    @property
    def wakes(self) -> Wakes:
        return self._wakes

    @property
    def flow(self) -> StepAdmission:
        return self._flow

    @property
    def namespace(self) -> str | None:
        return self._namespace

    @property
    def instance_id(self) -> str:
        return self._instance_id

    @property
    def executor(self) -> ThreadPoolExecutor:
        return self._executor()

    def clock(self) -> int:
        return self._clock()

    def fallback_wake_at(self) -> int | None:
        return self._fallback_wake_at()

    def step_definition(self, name: str) -> Step[Any, Any] | None:
        return self._registrations.step_definition(name)

    def registration(self, name: str, version: str | None = None) -> Workflow[Any, Any] | None:
        return self._registrations.registration(name, version)

    def resolve(
        self, workflow: Workflow[Any, Any] | str, version: str | None
    ) -> Workflow[Any, Any]:
        return self._registrations.resolve(workflow, version)

    def prepare_input(self, workflow: Workflow[Any, Any], input: Any) -> JSONValue:
        return self._registrations.prepare_input(workflow, input)

    def start_child_soon(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        child_id: str,
        parent: WorkflowRun,
        version: str | None,
        priority: int | None,
    ) -> None:
        self._starts.start_child_soon(workflow, input, child_id, parent, version, priority)

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return self._runs.spawn(coro)

    async def cancel(self, run_id: str) -> RunResult | None:
        return await cancel_run(self._plane, run_id)

    def run_created_here(self, run_id: str) -> None:
        self._runs.mark_fresh(run_id)  # no checkpoints to read on its first turn
        if self._runs.drive_runs:
            self._claims.queue_claim(run_id)

    async def children_created(self, first_id: str) -> None:
        if self._runs.drive_runs:
            self._wakes.kick()  # pick the new children up now (claim loop)
        else:
            await self._wakes.announce("ready", first_id)

    def post_completion(self, parent_id: str, child_id: str, completion: JSONValue) -> None:
        self._mailbox.post(parent_id, child_id, completion)
