"""Runs no worker here serves: parked `blocked` with a back-off instead of released.

A run of a workflow (or a version of it) registered nowhere on this engine used to have its
lease given back at once: the run was `pending` again, first in pick-up order, and the
next claim took it again — a hot loop of claim, release, claim that logged on every turn
and kept every run behind it from being picked up. Now the run is parked `blocked` with the
reason as its error (code `workflow.unserved`), out of the pending backlog (the claim's
index starts with the status, so parked rows are never read by a claim), and re-checked by
the due-timer poll with an exponential back-off: 5 s, 10 s, 20 s … capped at 5 min. It is
logged once, the first time it is parked; later re-checks log at debug level only.

An engine that does serve it does not wait for that back-off: every poll it lists the
`blocked` runs of the workflows it registers (`Poller.rescue_unserved`) and takes the ones
parked here with a version it has. A run parked while `pending` goes back to `pending`
under the lease when it is taken (so its first turn pins the version and emits
`run.started`); one parked after its first turn (a deploy removed its version) goes back
to `suspended`, and its next turn replays it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from durably._core import worker_beats
from durably._core.log_context import durably_logger
from durably._core.models import RunPatch, RunStatus, StepError, WorkflowRun, replace
from durably._engine.control.settle import SettleHost, release_quietly, update_if_status
from durably._engine.defs.events import EngineEvent

if TYPE_CHECKING:
    from durably._engine.defs.registry import Workflow

log = durably_logger("durably.worker")

UNSERVED_CODE = worker_beats.UNSERVED_CODE
# The first re-check comes this long after the first park; each later one waits twice as
# long as the one before, up to the cap.
FIRST_RECHECK_MS = 5_000
MAX_RECHECK_MS = 300_000
# The statuses a run may be parked from: a pending run (never picked up, or recovered), a
# run between turns, and a `cancelling` run recovered from a process that died while its
# saga unwound (its compensation needs the workflow's code: without it, releasing the run
# made recovery claim it again at every poll, logging an ERROR each time, until its
# recovery attempts ran out and it went `dead`). A `running` run is left to the turn driver.
PARKABLE: tuple[RunStatus, ...] = ("pending", "suspended", "blocked", "cancelling")


class LogOnce:
    """The workflows (name, version) a process has logged an unserved run of: the first run
    parked is logged, the next ones of the same workflow only at debug level — a thousand
    starts of one misspelt name are one warning, and each run still shows its reason.
    Bounded: past `limit` names it starts over (a name logged twice beats a leak)."""

    def __init__(self, limit: int = 10_000):
        self._seen: set[tuple[str, str]] = set()
        self._limit = limit

    def first(self, workflow: str, version: str) -> bool:
        key = (workflow, version)
        if key in self._seen:
            return False
        if len(self._seen) >= self._limit:
            self._seen.clear()
        self._seen.add(key)
        return True


def recheck_delay_ms(checks: int) -> int:
    """The back-off after the `checks`-th park (1 for the first)."""
    exponent = min(max(checks, 1) - 1, 16)  # 5 s << 16 is far past the cap already
    return min(FIRST_RECHECK_MS << exponent, MAX_RECHECK_MS)


def is_parked(run: WorkflowRun) -> bool:
    """A run parked here because no worker served it."""
    return run.status == "blocked" and run.error is not None and run.error.code == UNSERVED_CODE


def _details(run: WorkflowRun) -> dict[str, Any]:
    details = run.error.details if run.error is not None else None
    return details if isinstance(details, dict) else {}


def check_count(run: WorkflowRun) -> int:
    """How often the run was parked already (0 when it is not parked). The count is read
    from the row, which anyone with store access can write: a value that is not a positive
    integer counts as one park, and the count stops growing at 1,000 (long past the cap)."""
    if not is_parked(run):
        return 0
    checks = _details(run).get("checks")
    if isinstance(checks, int) and not isinstance(checks, bool) and checks > 0:
        return min(checks, 999)
    return 1


def _origin(run: WorkflowRun) -> RunStatus:
    """The status a parked run goes back to when a worker takes it: `pending` when it was
    parked before any turn of it began, `cancelling` when its saga was unwinding (its turn
    goes on unwinding), else `suspended` (its next turn replays it)."""
    origin = _details(run).get("origin") if is_parked(run) else run.status
    if origin in ("pending", "cancelling"):
        return "pending" if origin == "pending" else "cancelling"
    return "suspended"


def reason(run: WorkflowRun) -> str:
    version = run.workflow_version or "(newest)"
    return (
        f"no worker here serves workflow {run.workflow!r} version {version!r}; "
        "re-checked with a back-off until one does"
    )


def serves(workflows: list[Workflow[Any, Any]], run: WorkflowRun) -> bool:
    """Whether one of `workflows` runs `run`: its name, and its version unless it was
    started without one (then the newest registered version runs it)."""
    return any(
        wf.name == run.workflow and (not run.workflow_version or wf.version == run.workflow_version)
        for wf in workflows
    )


async def park(
    host: SettleHost,
    run: WorkflowRun,
    now_ms: int,
    *,
    parked_before: int | None = None,
    once: LogOnce | None = None,
) -> bool:
    """Park a leased run no worker here serves: `blocked`, the reason as its error, due again
    after the back-off, the lease released — one conditional write. Logged (and
    `run.blocked` emitted) the first time only — and with `once`, only for the first run of
    its workflow. `parked_before` is how often it was parked before when the row no longer
    says (it was unparked a moment ago). False when the run changed meanwhile (its lease is
    then given back)."""
    checks = (check_count(run) if parked_before is None else parked_before) + 1
    error = StepError(
        message=reason(run),
        code=UNSERVED_CODE,
        details={"checks": checks, "origin": _origin(run)},
        retryable=True,
    )
    patch: RunPatch = {
        "status": "blocked",
        "error": error,
        "wake_at": now_ms + recheck_delay_ms(checks),
        "locked_by": None,
        "locked_until": None,
    }
    if not await update_if_status(host, run.id, patch, (run.status,)):
        await release_quietly(host, run.id)
        return False
    if checks > 1:
        log.debug("run %s still unserved (check %d)", run.id, checks)
    elif once is not None and not once.first(run.workflow, run.workflow_version):
        log.debug("run %s parked: workflow %r is unserved (logged once)", run.id, run.workflow)
    else:
        log.warning(
            "run %s parked: no worker here serves workflow %r version %r (keep the version "
            "deployed while runs of it remain); re-checked with a back-off from %d s to %d s "
            "(later runs of it are parked without a warning)",
            run.id,
            run.workflow,
            run.workflow_version or "(newest)",
            FIRST_RECHECK_MS // 1000,
            MAX_RECHECK_MS // 1000,
        )
    if checks == 1:
        host.events.emit(
            EngineEvent(
                type="run.blocked",
                run_id=run.id,
                workflow=run.workflow,
                namespace=run.namespace,
                error=error,
                reason=error.message,
            )
        )
    host.wakes.announce_soon("settled", run.id)
    return True


async def unpark(host: SettleHost, run: WorkflowRun) -> WorkflowRun | None:
    """A leased parked run that a worker here serves: back to the status it was parked from,
    its error cleared, the lease kept (one conditional write). None when it changed
    meanwhile (the lease is then given back)."""
    origin = _origin(run)
    patch: RunPatch = {"status": origin, "error": None, "wake_at": None}
    if not await update_if_status(host, run.id, patch, ("blocked",)):
        await release_quietly(host, run.id)
        return None
    return replace(run, status=origin, error=None, wake_at=None)
