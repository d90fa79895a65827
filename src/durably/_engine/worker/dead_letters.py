"""Dead-letter workflows: the run started for a run that crash recovery gave up on.

A run whose owner keeps crashing (a step that kills its process, runs it out of memory) is
recovered again and again; past `max_recovery_attempts` the poller marks it `dead`. Before
that write it asks `DeadLetters.start` to start the run's dead-letter workflow, if one is
configured: the workflow's own `dead_letter=` beats the engine's `dead_letter_workflow=`.

The handler run has the id `dlq:<runId>` and the input `{deadRunId, workflow, input,
error}`. Starting is idempotent by that id, and it happens before the `dead` write: a
process that crashes in between leaves the run `running`, the next recovery gives up on it
again and the start returns the run that already exists. So the handler runs once per dead
run, even when the dead run is retried and dies again.

A dead-letter run that dies itself gets no handler of its own: a handler that crashes its
process would otherwise start handlers of handlers, one per death.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durably._core.errors import WorkflowNotFoundError
from durably._core.log_context import durably_logger
from durably._core.models import JSONValue, StepError, WorkflowRun
from durably._engine.control.start import StartRequest
from durably._engine.defs.registry import Workflow

if TYPE_CHECKING:
    from durably._engine.worker.hosts import Registrations, RunStarts

log = durably_logger("durably.worker")

DEAD_LETTER_PREFIX = "dlq:"


def dead_letter_run_id(run_id: str) -> str:
    """The id of the dead-letter run started for the dead run `run_id`."""
    return f"{DEAD_LETTER_PREFIX}{run_id}"


def dead_letter_input(run: WorkflowRun, error: StepError) -> dict[str, JSONValue]:
    """What the handler receives: the dead run's id, workflow name, input and the error
    that ended it (camelCase keys, like every JSON durably writes)."""
    return {
        "deadRunId": run.id,
        "workflow": run.workflow,
        "input": run.input,
        "error": error.to_json(),
    }


class DeadLetters:
    """Starts the dead-letter run of a run about to be marked dead."""

    def __init__(
        self,
        registrations: Registrations,
        starts: RunStarts,
        default: Workflow[Any, Any] | str | None,
    ):
        self._registrations = registrations
        self._starts = starts
        self._default = default

    def handler_for(self, run: WorkflowRun) -> Workflow[Any, Any] | str | None:
        """The dead-letter workflow of `run`: its workflow's `dead_letter=`, else the
        engine's; None for a dead-letter run itself (no handlers of handlers)."""
        if run.id.startswith(DEAD_LETTER_PREFIX):
            return None
        version = run.workflow_version or None
        own = self._registrations.registration(run.workflow, version)
        if own is None and version is not None:
            own = self._registrations.registration(run.workflow)
        if own is not None and own.dead_letter is not None:
            return own.dead_letter
        return self._default

    async def start(self, run: WorkflowRun, error: StepError) -> str | None:
        """Start `run`'s dead-letter run (idempotent); its id, or None when no handler is
        configured or it could not be started (logged: the run is dead either way, and a
        failing handler must not keep a poison pill alive)."""
        handler = self.handler_for(run)
        if handler is None:
            return None
        run_id = dead_letter_run_id(run.id)
        payload = dead_letter_input(run, error)
        name = handler.name if isinstance(handler, Workflow) else handler
        request = StartRequest(workflow=name, run_id=run_id, namespace=run.namespace)
        registrations = self._registrations
        try:
            try:
                wf = registrations.resolve(handler, None)
            except WorkflowNotFoundError:
                # Not registered here: a workflow the fleet serves elsewhere, or an error
                # naming the close names.
                return await self._starts.start_served_elsewhere(payload, request)
            json_input = registrations.prepare_input(wf, payload)
            return await self._starts.create_run(wf, json_input, request)
        except Exception:
            log.exception(
                "could not start the dead-letter workflow %r for dead run %s", name, run.id
            )
            return None
