"""Small fakes of the hosts the worker's parts are given (each implements one protocol), and
the real in-memory store. No engine and no worker: a test builds the one part it drives."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from datetime import UTC, datetime
from typing import Any

from durably._core.models import JSONValue, StepCheckpoint, StepError, WorkflowRun
from durably._engine.defs.events import EngineEvent
from durably._engine.defs.options import EngineOptions
from durably._engine.defs.registry import Step, Workflow
from durably._engine.run.execution import Execution
from durably._engine.run.resident import ResidentSet
from durably._store.memory import InMemoryStateStore

INSTANCE = "me"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def pending_run(run_id: str, workflow: str = "wf", **fields: Any) -> WorkflowRun:
    values: dict[str, Any] = {"status": "pending", "input": None, **fields}
    return WorkflowRun(
        id=run_id,
        workflow=workflow,
        workflow_version="1",
        created_at=T0,
        updated_at=T0,
        **values,
    )


class Clock:
    """The engine clock, in epoch ms, moved by the test."""

    def __init__(self, now: int = 1_000_000):
        self.now = now

    def __call__(self) -> int:
        return self.now


class Tasks:
    """`BackgroundTasks`: tracked tasks a test can wait for."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        return task

    async def settle(self) -> None:
        while pending := [t for t in self.tasks if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)


class Events:
    """The event bus a settle emits on: a record of what was emitted."""

    def __init__(self) -> None:
        self.emitted: list[EngineEvent] = []

    def emit(self, event: EngineEvent) -> None:
        self.emitted.append(event)

    def types(self, run_id: str) -> list[str]:
        return [e.type for e in self.emitted if e.run_id == run_id]


class Wakes:
    """The wake bus: a record of what was announced and how often a pick-up was asked."""

    def __init__(self) -> None:
        self.announced: list[tuple[str, str]] = []
        self.kicks = 0

    async def announce(self, kind: str, run_id: str) -> None:
        self.announced.append((kind, run_id))

    def announce_soon(self, kind: str, run_id: str) -> None:
        self.announced.append((kind, run_id))

    def kick(self) -> None:
        self.kicks += 1


class Settle:
    """`saga.CancelHost` (hence `settle.SettleHost`) over a real store."""

    def __init__(self, store: InMemoryStateStore):
        self._store = store
        self._events = Events()
        self._wakes = Wakes()
        self.parents: list[tuple[str, dict[str, Any]]] = []
        self.cancelled: list[str] = []

    @property
    def store(self) -> InMemoryStateStore:
        return self._store

    @property
    def events(self) -> Events:
        return self._events

    @property
    def wakes(self) -> Wakes:
        return self._wakes

    def notify_parent(self, run: WorkflowRun | str, completion: dict[str, Any]) -> None:
        self.parents.append((run if isinstance(run, str) else run.id, completion))

    def fire_cancel(self, run_id: str) -> None:
        self.cancelled.append(run_id)


class Runs(Tasks):
    """The runs here as the turn driver, the router and the poller see them: executions by
    id, dispatches recorded (not run; a dispatched run is held, as the dispatcher holds it),
    the drain flag, the room taken."""

    def __init__(self, *, drive_runs: bool = True) -> None:
        super().__init__()
        self._executions: dict[str, Execution] = {}
        self.dispatched: list[tuple[str, WorkflowRun | None]] = []
        self.began: list[str] = []
        self.fresh: set[str] = set()
        self._drive_runs = drive_runs
        self._draining = False
        self.held: set[str] = set()

    @property
    def drive_runs(self) -> bool:
        return self._drive_runs

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def load(self) -> int:
        return len(self.held | set(self._executions))

    @property
    def busy(self) -> bool:
        return bool(self._executions)

    def begin_drain(self) -> None:
        self._draining = True

    def execution(self, run_id: str) -> Execution | None:
        return self._executions.get(run_id)

    def executions(self) -> list[Execution]:
        return list(self._executions.values())

    def executing_ids(self) -> list[str]:
        return list(self._executions)

    def holds(self, run_id: str) -> bool:
        return run_id in self._executions or run_id in self.held

    def dispatch(
        self, run_id: str, *, nudge: bool = False, claimed: WorkflowRun | None = None
    ) -> None:
        self.dispatched.append((run_id, claimed))
        self.held.add(run_id)

    def mark_fresh(self, run_id: str) -> None:
        self.fresh.add(run_id)

    def take_fresh(self, run_id: str) -> bool:
        if run_id in self.fresh:
            self.fresh.discard(run_id)
            return True
        return False

    def turn_began(self, execution: Execution) -> None:
        self.began.append(execution.run_id)
        self._executions[execution.run_id] = execution

    def turn_ended(self, run_id: str) -> None:
        self._executions.pop(run_id, None)

    def pending_tasks(self) -> list[asyncio.Task[Any]]:
        return [t for t in self.tasks if not t.done()]


class Children:
    """How the router starts a handler (a `ChildStarter`): a record of the starts."""

    def __init__(self) -> None:
        self.started: list[tuple[str, Any, str, str]] = []

    def __call__(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        child_id: str,
        parent: WorkflowRun,
        version: str | None,
        priority: int | None,
    ) -> None:
        name = workflow.name if isinstance(workflow, Workflow) else workflow
        self.started.append((name, input, child_id, parent.id))


class NoRoutes:
    """`FailureRouting` with no onError route anywhere."""

    def __init__(self) -> None:
        self.failures: list[tuple[str, StepError]] = []

    async def route_failure(self, run: WorkflowRun, error: StepError) -> bool:
        self.failures.append((run.id, error))
        return False

    async def follow_handoff(self, run: WorkflowRun, cps: Sequence[StepCheckpoint]) -> bool:
        return False


class RunHost:
    """`run.host.RunHost` for bodies that run no step, child or timer: what an execution and
    its ctx read at the start and the end of a turn."""

    def __init__(self, settle: Settle, runs: Runs, clock: Clock, options: EngineOptions):
        self._settle = settle
        self._runs = runs
        self._clock = clock
        self._options = options
        self._resident = ResidentSet(options.max_resident_runs)

    @property
    def store(self) -> InMemoryStateStore:
        return self._settle.store

    @property
    def options(self) -> EngineOptions:
        return self._options

    @property
    def events(self) -> Any:
        return self._settle.events

    @property
    def resident(self) -> ResidentSet:
        return self._resident

    @property
    def transport(self) -> Any:
        raise AssertionError("these bodies run no step")

    @property
    def remote(self) -> None:
        return None

    @property
    def wakes(self) -> Wakes:
        return self._settle.wakes

    @property
    def flow(self) -> Any:
        raise AssertionError("these bodies run no queued step")

    @property
    def namespace(self) -> str | None:
        return None

    @property
    def instance_id(self) -> str:
        return INSTANCE

    @property
    def executor(self) -> Any:
        raise AssertionError("these bodies run no sync code")

    def clock(self) -> int:
        return self._clock()

    def fallback_wake_at(self) -> int | None:
        return None

    def step_definition(self, name: str) -> Step[Any, Any] | None:
        return None

    def registration(self, name: str, version: str | None = None) -> Workflow[Any, Any] | None:
        return None

    def resolve(self, workflow: Workflow[Any, Any] | str, version: str | None) -> Any:
        raise AssertionError("these bodies start no child")

    def prepare_input(self, workflow: Workflow[Any, Any], input: Any) -> JSONValue:
        raise AssertionError("these bodies start no child")

    def start_child_soon(self, *args: Any) -> None:
        raise AssertionError("these bodies start no child")

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return self._runs.spawn(coro)

    async def cancel(self, run_id: str) -> Any:
        raise AssertionError("these bodies cancel nothing")

    def run_created_here(self, run_id: str) -> None:
        raise AssertionError("these bodies create no run")

    async def children_created(self, first_id: str) -> None:
        raise AssertionError("these bodies create no run")

    def post_completion(self, parent_id: str, child_id: str, completion: JSONValue) -> None:
        raise AssertionError("these bodies have no child")
