"""What a run executing in this process needs from the worker runtime that drives it.

`RunHost` is the whole of it: `Execution`, `WorkflowCtx`, fans, children and sagas name their
collaborators here instead of holding an engine, and the worker runtime implements it (its
`worker.hosts.ExecutionHost`). Being protocols, these let those modules be read (and tested)
without the worker, and keep the runtime's imports free of cycles.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from durably._core.admission import QueueCall
from durably._core.models import JSONValue, StepError, WorkflowRun
from durably._engine.defs.registry import RetryPolicy, Step, Workflow
from durably._engine.defs.typed_io import ValueCodec

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from durably._engine.defs.events import EventBus
    from durably._engine.defs.intercept import Interceptors
    from durably._engine.defs.options import EngineOptions
    from durably._engine.run.execution import Execution
    from durably._engine.run.resident import ResidentSet
    from durably._store.protocol import StateStore

__all__ = ["RemoteDispatch", "RunHost", "RunWakes", "StepAdmission", "StepTransport"]


class StepTransport(Protocol):
    """Where a step's handler runs (the in-process transport today)."""

    async def execute(
        self,
        execution: Execution,
        step: Step[Any, Any] | None,
        name: str,
        json_input: JSONValue,
        in_codec: ValueCodec,
        timeout_ms: int | None,
        *,
        policy: RetryPolicy | None = None,
    ) -> tuple[JSONValue, StepError | None]: ...


class RemoteDispatch(Protocol):
    """Sends a step attempt to the workers that serve its name (an engine with a transport)."""

    async def dispatch(
        self,
        run: WorkflowRun,
        seq: int,
        name: str,
        json_input: JSONValue,
        attempt: int,
        *,
        traceparent: str | None = None,
    ) -> None:
        """Returns once a broker holds the task; raises when no transport would take it."""
        ...

    def token_for(self, run: WorkflowRun, name: str) -> str:
        """The routing token a step of `run` named `name` is queued on."""
        ...

    async def blocked(self, run: WorkflowRun, name: str, requires: Sequence[str]) -> Any:
        """Why a step requiring `requires` cannot go out now (with `reason`, `code`,
        `requires`, `diagnostics.to_json()`), or None when a live worker offers it all."""
        ...


class StepAdmission(Protocol):
    """The flow-control queues of this process: slots for steps given `queue=`
    (`flow.FlowControl`)."""

    def slot(
        self, ex: Execution, seq: int, call: QueueCall | None
    ) -> AbstractAsyncContextManager[None]:
        """Hold a slot while an in-process step's handler runs (waits to be admitted)."""
        ...

    async def acquire(self, ex: Execution, seq: int, call: QueueCall) -> bool:
        """Wait until step `seq` is admitted (False: the queue is not registered here)."""
        ...

    def release(self, run_id: str, seq: int) -> None:
        """Give back the slot the step holds here, if any (in the background)."""
        ...


class RunWakes(Protocol):
    """Telling other processes (and this one's pick-up) that something happened."""

    def announce_soon(self, kind: str, run_id: str) -> None: ...


class RunHost(Protocol):
    """What a run executing here needs from the worker runtime that drives it — the whole
    of it, so the execution, its context, fans, children and saga name their collaborators
    here instead of reaching into an engine.

    The worker runtime implements it (`worker.hosts.ExecutionHost`).
    """

    @property
    def store(self) -> StateStore: ...

    @property
    def options(self) -> EngineOptions: ...

    @property
    def events(self) -> EventBus: ...

    @property
    def resident(self) -> ResidentSet: ...

    @property
    def transport(self) -> StepTransport: ...

    @property
    def interceptors(self) -> Interceptors:
        """The engine's interceptors, around each step attempt (falsy when there are none)."""
        ...

    @property
    def remote(self) -> RemoteDispatch | None:
        """Where steps go when the engine has a transport (None: they run in-process)."""
        ...

    @property
    def capabilities(self) -> tuple[str, ...]:
        """What this engine declares it offers (`Engine(capabilities=…)`): an in-process step
        whose `requires` they cover runs here."""
        ...

    @property
    def wakes(self) -> RunWakes: ...

    @property
    def flow(self) -> StepAdmission: ...

    @property
    def namespace(self) -> str | None: ...

    @property
    def instance_id(self) -> str: ...

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The runtime's own thread pool for sync user code (never the loop's default)."""
        ...

    def clock(self) -> int:
        """Now, in epoch milliseconds (the engine's clock)."""
        ...

    def fallback_wake_at(self) -> int | None:
        """The reconcile safety-net wake of an event-waiting suspend; None when disabled."""
        ...

    def step_definition(self, name: str) -> Step[Any, Any] | None:
        """The step registered under `name` (this runtime's, else any decorated one)."""
        ...

    def registration(self, name: str, version: str | None = None) -> Workflow[Any, Any] | None:
        """The workflow registered here (newest when `version` is None)."""
        ...

    def resolve(
        self, workflow: Workflow[Any, Any] | str, version: str | None
    ) -> Workflow[Any, Any]:
        """The registered workflow to start, or `WorkflowNotFoundError`."""
        ...

    def prepare_input(self, workflow: Workflow[Any, Any], input: Any) -> JSONValue:
        """A start input validated against the workflow's annotation, as JSON."""
        ...

    def start_child_soon(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        child_id: str,
        parent: WorkflowRun,
        version: str | None,
        priority: int | None,
    ) -> None:
        """Start a child run after the current turn; a failed start fails the parent's wait."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run a coroutine in the background, tracked by the runtime."""
        ...

    async def cancel(self, run_id: str) -> Any:
        """Cancel a run (a fail-fast fan's unfinished children)."""
        ...

    def run_created_here(self, run_id: str) -> None:
        """A child run was just created by this process (claimed by id, no history read)."""
        ...

    async def children_created(self, first_id: str) -> None:
        """New child runs exist: pick them up now (or tell the processes that drive)."""
        ...

    def post_completion(self, parent_id: str, child_id: str, completion: JSONValue) -> None:
        """Deliver a child's completion to its parent (batched, in the background)."""
        ...
