"""`RunHandle` and the settled/terminal predicates of `wait_for_run`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from durably._core.errors import RunFailedError
from durably._core.models import RunStatus, WorkflowRun

if TYPE_CHECKING:
    from durably._engine.registry import Workflow

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


Lookup = Callable[[str, "str | None"], "Workflow[Any, Any] | None"]


class RunHandle(Generic[O]):
    """A started run: `await handle.result()` for its output.

    The output is decoded with the workflow's return annotation when the workflow is known
    here (`workflow`, or found by `lookup` — an engine's registry); otherwise — a client
    without the workflow's code — `result()` returns the stored JSON value.
    """

    def __init__(
        self,
        source: RunSource,
        run_id: str,
        workflow: Workflow[Any, O] | None = None,
        lookup: Lookup | None = None,
    ):
        self._source = source
        self.run_id = run_id
        self._workflow = workflow
        self._lookup = lookup

    def __repr__(self) -> str:
        return f"<RunHandle {self.run_id!r}>"

    async def result(self, timeout: float | None = None) -> O:
        """Wait until the run is terminal; its output, or `RunFailedError`."""
        run = await self._source.wait_for_run(self.run_id, timeout=timeout, until="terminal")
        if run.status != "completed":
            raise RunFailedError(run.id, run.status, run.error)
        workflow = self._workflow
        if workflow is None and self._lookup is not None:
            workflow = self._lookup(run.workflow, run.workflow_version or None)
        if workflow is None or run.output is None:
            # a continued-as-new run completes without output
            value: O = run.output
            return value
        decoded: O = workflow.output_codec.from_json(run.output)
        return decoded

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
