"""`RunHandle`, the settled/terminal predicates of `wait_for_run`, and `RunWatchers`, the
one wait loop behind every `wait_for_run` (a `Client`'s and an `Engine`'s)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from pydantic import ValidationError

from durably._core.errors import RunFailedError, RunNotFoundError, SerializationError
from durably._core.models import JSONValue, RunStatus, WorkflowRun, replace
from durably._engine.control.on_error import routed_to

if TYPE_CHECKING:
    from durably._engine.defs.registry import Workflow
    from durably._engine.defs.typed_io import ValueCodec
    from durably._store.protocol import StateStore

O = TypeVar("O")

WaitUntil = Literal["settled", "terminal"]


def is_settled(run: WorkflowRun, until: WaitUntil) -> bool:
    """`settled` = not pending/running/cancelling and not awaiting a remote
    decision (blocked and plain suspended count); `terminal` = completed/failed/cancelled/dead."""
    if until == "terminal":
        return run.is_terminal
    if run.status in ("pending", "running", "cancelling"):
        return False
    return not (run.status == "suspended" and run.awaiting_decision_task_id)


class RunSource(Protocol):
    """Where a handle reads its run: an `Engine` or a `Client`."""

    async def wait_for_run(
        self, run_id: str, timeout: float | None = None, until: WaitUntil = "settled"
    ) -> WorkflowRun: ...

    async def get_run(self, run_id: str) -> WorkflowRun | None: ...

    @property
    def store(self) -> StateStore:
        """Where the run's rows are (a routed run's handoff is read there)."""
        ...


Lookup = Callable[[str, "str | None"], "Workflow[Any, Any] | None"]


class RunHandle(Generic[O]):
    """A started run: `await handle.result()` for its output.

    The output is decoded with `output` when the start gave one (`output_type=`, a start by
    name), else with the workflow's return annotation when the workflow is known here
    (`workflow`, or found by `lookup` — an engine's registry); otherwise — a client without
    the workflow's code — `result()` returns the stored JSON value.

    A run an onError route handed to its handler completes with the handler's output, so
    `result()` decodes that with the HANDLER's return annotation (the handler workflow found
    by `lookup`, at the version its run had), or returns the stored JSON when the handler is
    not known here (or its run was deleted). It is then not an `O`: a handler that recovers a
    failure rarely returns what the workflow would have (a refund for a receipt), and decoding
    it as the workflow's type would refuse the one value the run actually has.
    """

    def __init__(
        self,
        source: RunSource,
        run_id: str,
        workflow: Workflow[Any, O] | None = None,
        lookup: Lookup | None = None,
        *,
        output: ValueCodec | None = None,
    ):
        self._source = source
        self.run_id = run_id
        self._workflow = workflow
        self._lookup = lookup
        self._output = output

    def __repr__(self) -> str:
        return f"<RunHandle {self.run_id!r}>"

    async def result(self, timeout: float | None = None) -> O:
        """Wait until the run is terminal; its output, or `RunFailedError`."""
        run = await self._source.wait_for_run(self.run_id, timeout=timeout, until="terminal")
        if run.status != "completed":
            raise RunFailedError(run.id, run.status, run.error)
        if self._output is not None and run.output is not None:
            try:
                typed: O = self._output.from_json(run.output)
            except ValidationError as exc:
                raise SerializationError(
                    f"the output of run {run.id} is not a {self._output.annotation!r}: "
                    + str(exc).replace("\n", "; ")
                ) from None
            return typed
        workflow = self._workflow
        if workflow is None and self._lookup is not None:
            workflow = self._lookup(run.workflow, run.workflow_version or None)
        if workflow is None or run.output is None:
            # a continued-as-new run completes without output
            value: O = run.output
            return value
        # Only a workflow declared with onError routes can be routed (the router follows the
        # routes of the run's registration), so the others never pay for the handoff read.
        handler_id = await routed_to(self._source.store, run.id) if workflow.on_error else None
        if handler_id is not None:
            handled: O = await self._handler_output(run, handler_id)
            return handled
        decoded: O = workflow.output_codec.from_json(run.output)
        return decoded

    async def _handler_output(self, run: WorkflowRun, handler_id: str) -> Any:
        """A routed run's output: its handler's, decoded as the handler declares it (see the
        class docstring); the stored JSON when the handler (or its run) is not known here."""
        handler_run = await self._source.get_run(handler_id)
        if handler_run is None or self._lookup is None:
            return run.output
        handler = self._lookup(handler_run.workflow, handler_run.workflow_version or None)
        if handler is None:
            return run.output
        return handler.output_codec.from_json(run.output)

    async def wait(self, timeout: float | None = None) -> WorkflowRun:
        """Wait until the run is settled (terminal, suspended or blocked)."""
        return await self._source.wait_for_run(self.run_id, timeout=timeout, until="settled")

    async def status(self) -> RunStatus:
        run = await self._source.get_run(self.run_id)
        if run is None:
            raise LookupError(f"run {self.run_id} not found")
        return run.status


@dataclass(frozen=True, slots=True)
class UpdateResult:
    """The answer to `Engine.update`: accepted, or the reason it was rejected."""

    accepted: bool
    reason: str | None = None
    delivered: bool = False


class _Watch(asyncio.Event):
    """Set whenever the watched run may have changed; remembers the output of a completion
    this process saw happen."""

    def __init__(self) -> None:
        super().__init__()
        self.completed = False
        self.output: JSONValue = None


def _why(run: WorkflowRun) -> str:
    """What a wait that timed out tells about the run: a blocked run never moves on its own
    (no live worker offers what its next step requires), so the reason is part of the
    error rather than something to go and read."""
    if run.status == "blocked" and run.error is not None:
        return f" (the run is blocked: {run.error.message})"
    return f" (the run is {run.status})"


class RunWatchers:
    """The `wait_for_run` calls of one process, and their wake-ups.

    A wait re-reads the run from the store when woken (`wake`: a `settled` message on the
    wake bus, or an event of a run driven here) and otherwise polls, at the interval the
    owner chooses per run (`poll`); a completion this process saw happen (`completed`)
    answers without a store read.
    """

    def __init__(self) -> None:
        self._watchers: dict[str, set[_Watch]] = {}

    def wake(self, run_id: str) -> None:
        """Make every wait on this run re-read the store."""
        for watch in self._watchers.get(run_id, ()):
            watch.set()

    def completed(self, run_id: str, output: JSONValue) -> None:
        """The run completed in this process with `output`: waits on it return at once."""
        for watch in self._watchers.get(run_id, ()):
            watch.completed = True
            watch.output = output
            watch.set()

    async def wait(
        self,
        store: StateStore,
        run_id: str,
        *,
        timeout: float | None,
        until: WaitUntil,
        poll: Callable[[str], float],
    ) -> WorkflowRun:
        """The run once it is settled (or terminal); `TimeoutError` after `timeout` s."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        watch = _Watch()
        self._watchers.setdefault(run_id, set()).add(watch)
        try:
            run: WorkflowRun | None = None
            while True:
                watch.clear()
                if run is not None and watch.completed:
                    # This process completed the run: the output came with the news, so no
                    # store read is needed to return the final state.
                    return replace(run, status="completed", output=watch.output, error=None)
                run = await store.get_run(run_id)
                if run is None:
                    raise RunNotFoundError(f"run {run_id} not found")
                if is_settled(run, until):
                    return run
                interval = poll(run_id)
                if deadline is not None:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        raise TimeoutError(
                            f"wait_for_run({run_id}) timed out after {timeout}s{_why(run)}"
                        )
                    interval = min(interval, remaining)
                try:
                    await asyncio.wait_for(watch.wait(), interval)
                except TimeoutError:
                    pass
        finally:
            watchers = self._watchers.get(run_id)
            if watchers is not None:
                watchers.discard(watch)
                if not watchers:
                    del self._watchers[run_id]
