"""onError routing: a failed run handed to a handler workflow by error code.

Only routes of LOCALLY registered workflows apply. Routes announced by remote workers for
workflows they serve without a local registration (and the `run.unrouted` report when
those workers disagree) need remote worker groups, which this engine does not have yet: a
run without a local registration is never routed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from durably._core.log_context import durably_logger
from durably._core.models import (
    HANDOFF_SEQ_BASE,
    StepCheckpoint,
    StepError,
    WorkflowRun,
)
from durably._engine.defs.registry import OnErrorInput, OnErrorRoute, Workflow

if TYPE_CHECKING:
    from durably._store.protocol import CheckpointStore

log = durably_logger("durably.engine")

HANDOFF_PREFIX = "signal:child:"
RETIRED_PREFIX = "handoff:retired:"


def on_error_run_id(run_id: str, attempt: int) -> str:
    """The handler run's id: `<runId>.onError.<attempt>` (attempt 1-based)."""
    return f"{run_id}.onError.{attempt}"


def handoff_name(handler_id: str) -> str:
    """The handoff row's name: the name the child wake writes, so it overwrites the row."""
    return f"{HANDOFF_PREFIX}{handler_id}"


def retired_handoff_name(handler_id: str) -> str:
    """A retried run's old handoff row is renamed to this distinct non-child name: kept for
    the timeline, never followed."""
    return f"{RETIRED_PREFIX}{handler_id}"


def route_for(routes: Sequence[OnErrorRoute], error: StepError) -> OnErrorRoute | None:
    """The route for a failure: exact code, else the catch-all; never `non_determinism`
    (a broken deploy is never routed, even by an explicit or catch-all route)."""
    if not routes or error.code == "non_determinism":
        return None
    catch_all: OnErrorRoute | None = None
    for route in routes:
        if route.code is None:
            catch_all = route
        elif error.code is not None and route.code == error.code:
            return route
    return catch_all


def handoff_checkpoints(cps: Sequence[StepCheckpoint]) -> list[StepCheckpoint]:
    """The handoff rows: `seq >= HANDOFF_SEQ_BASE`, live or retired."""
    return [cp for cp in cps if cp.seq >= HANDOFF_SEQ_BASE]


def handoff_handler_id(run_id: str, cp: StepCheckpoint) -> str | None:
    """The handler id a LIVE handoff row names, else None."""
    if cp.seq < HANDOFF_SEQ_BASE or not cp.name.startswith(HANDOFF_PREFIX):
        return None
    handler_id = cp.name[len(HANDOFF_PREFIX) :]
    if not handler_id.startswith(f"{run_id}.onError."):
        return None
    return handler_id


def live_handoff(run_id: str, cps: Sequence[StepCheckpoint]) -> StepCheckpoint | None:
    """The highest-seq unretired handoff row, else None."""
    live = [cp for cp in handoff_checkpoints(cps) if handoff_handler_id(run_id, cp)]
    return max(live, key=lambda cp: cp.seq) if live else None


async def routed_to(store: CheckpointStore, run_id: str) -> str | None:
    """The handler run id of the live handoff of `run_id`, or None when the run is not
    routed now (never routed, or retried since: a retry retires its handoffs). A completed
    run with a live handoff completed with that handler's output.

    One primary-key read answers for a run that was never routed: every routed run has a
    handoff row at `HANDOFF_SEQ_BASE` (its first attempt's), so only a routed one pays for
    the read of its handoff rows. (The row names the handler run only: the child wake that
    completes it overwrites the workflow it recorded, so the handler's workflow is read off
    the handler run.)"""
    if await store.get_checkpoint(run_id, HANDOFF_SEQ_BASE) is None:
        return None
    rows = await store.list_checkpoints_by_name_prefix(
        run_id, [f"{HANDOFF_PREFIX}{run_id}.onError."]
    )
    cp = live_handoff(run_id, rows)
    return handoff_handler_id(run_id, cp) if cp is not None else None


def on_error_input(run: WorkflowRun, error: StepError) -> dict[str, Any]:
    """The handler's input (`OnErrorInput`: the failed run's id, workflow, input and
    error) as camelCase JSON."""
    return OnErrorInput(
        run_id=run.id, workflow=run.workflow, input=run.input, error=error
    ).to_json()


class ChildStarter(Protocol):
    def __call__(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        child_id: str,
        parent: WorkflowRun,
        version: str | None,
        priority: int | None,
    ) -> None: ...
