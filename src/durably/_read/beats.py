"""What the workers' heartbeat rows tell the read side about a run that waits.

- A run parked because no worker served its workflow (`blocked`, code
  `workflow.unserved`) waits on a worker: `RunWaiting(on="worker", name=<workflow>,
  detail="no worker serves workflow …")`, read from the run row alone.
- A suspended run whose pending remote step was dispatched to a routing token no live worker
  beats on: `RunWaiting(on="step", name=<token>, detail="no worker beats on token …")`. The
  token is the step row's `worker_group`; whether a worker beats on it is what the live
  heartbeat rows of engines with a transport report (`durably._core.worker_beats`), so a
  process with only the store can tell, within one beat interval of the fleet changing.
  Nothing is said when no live row reports a transport (no one can tell), nor for a token
  some worker consumes (the step is simply in flight).

The step check costs one checkpoint read per run it looks at, so it looks at no more than
`MAX_STEP_CHECKS` runs per call, and only when some live row reports a transport.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from durably._core.aggregates import CheckpointQuery
from durably._core.models import WorkflowRun
from durably._core.worker_beats import (
    LIVE_WINDOW_MS,
    MAX_BEAT_ROWS,
    UNSERVED_CODE,
    FleetView,
    wall_ms,
)
from durably._read.list_models import RunWaiting
from durably._store.protocol import CheckpointStore, FleetStore, ReadStore

__all__ = [
    "MAX_STEP_CHECKS",
    "live_fleet",
    "step_waits",
    "unserved_waiting",
]

MAX_STEP_CHECKS = 50
"""At most this many suspended runs have their pending steps read per call."""
# Pending rows read per run: a wide fan of remote steps shares one token per step name, so
# the first rows tell.
_PENDING_ROWS = 20


async def live_fleet(store: FleetStore, namespace: str | None) -> FleetView:
    """The live heartbeat rows of `namespace` (and of workers serving every namespace;
    None: all)."""
    since = wall_ms() - LIVE_WINDOW_MS
    return FleetView.of(await store.list_worker_beats(namespace, since, MAX_BEAT_ROWS))


def unserved_waiting(run: WorkflowRun) -> RunWaiting | None:
    """The wait of a run parked because no worker serves its workflow; else None."""
    if run.status != "blocked" or run.error is None or run.error.code != UNSERVED_CODE:
        return None
    version = f" version {run.workflow_version!r}" if run.workflow_version else ""
    return RunWaiting(
        on="worker",
        name=run.workflow,
        detail=f"no worker serves workflow {run.workflow!r}{version}",
    )


class StepWaitStore(FleetStore, CheckpointStore, ReadStore, Protocol):
    """The heartbeat rows and the runs' pending step rows."""


async def _unconsumed_step(
    store: StepWaitStore, run: WorkflowRun, view: FleetView
) -> RunWaiting | None:
    pending = await store.query_checkpoints(
        run.id, CheckpointQuery(statuses=("pending",), limit=_PENDING_ROWS)
    )
    for cp in pending:
        token = cp.worker_group
        if token and view.token_consumed(token) is False:
            return RunWaiting(
                on="step",
                name=token,
                detail=f"no worker beats on token {token!r} (step {cp.name!r})",
            )
    return None


async def step_waits(store: StepWaitStore, runs: Sequence[WorkflowRun]) -> dict[str, RunWaiting]:
    """run id → the wait of each of `runs` (suspended ones, at most `MAX_STEP_CHECKS`) on a
    remote step whose token no live worker beats on. One heartbeat read, then one pending
    step read per run — none at all when no live row reports a transport."""
    candidates = [r for r in runs if r.status == "suspended"][:MAX_STEP_CHECKS]
    if not candidates:
        return {}
    view = await live_fleet(store, None)
    if not view.sees_transport:
        return {}
    found = await asyncio.gather(*(_unconsumed_step(store, r, view) for r in candidates))
    return {run.id: wait for run, wait in zip(candidates, found, strict=True) if wait}
