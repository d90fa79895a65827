"""Ending a turn in the store: the conditional writes that settle a run, and giving a
lease back.

Every write here only lands while the run is still in the statuses the caller expects, so
a run settled meanwhile by another process (a cancel, a recovery) is never resurrected.
The module needs only what `SettleHost` describes (the `Engine` provides it), so the
driver, onError routing, the saga's cancel and the poller settle runs the same way
without importing each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from durably._core.log_context import durably_logger
from durably._core.models import (
    LIVE_RUN_STATUSES,
    RunPatch,
    RunStatus,
    StepError,
    WorkflowRun,
    now_utc,
)
from durably._engine.defs.events import EngineEvent, lived_ms
from durably._engine.defs.vocab import completion_of_failure
from durably._engine.flow import singleton

if TYPE_CHECKING:
    from durably._store.protocol import StateStore

log = durably_logger("durably.engine")

# Statuses a turn may still settle over; anything else was changed under it (cancel, ...).
_LIVE = LIVE_RUN_STATUSES


class _Events(Protocol):
    def emit(self, event: EngineEvent) -> None: ...


class _Wakes(Protocol):
    def announce_soon(self, kind: str, run_id: str) -> None: ...
    def kick(self) -> None: ...


class SettleHost(Protocol):
    """What settling a run needs: the store, where its event goes, how its parent hears of
    it, and the wake bus that tells other processes."""

    @property
    def store(self) -> StateStore: ...

    @property
    def events(self) -> _Events: ...

    @property
    def wakes(self) -> _Wakes: ...

    def notify_parent(self, run: WorkflowRun | str, completion: dict[str, Any]) -> None: ...


async def update_if_live(host: SettleHost, run_id: str, patch: RunPatch) -> bool:
    """Write a settle patch unless the run was settled meanwhile (never resurrect a run
    another process cancelled)."""
    return await update_if_status(host, run_id, patch, _LIVE)


async def update_if_status(
    host: SettleHost, run_id: str, patch: RunPatch, statuses: tuple[RunStatus, ...]
) -> bool:
    """A write that only lands while the run is still in one of `statuses`."""
    return await host.store.update_run_if_status(run_id, patch, statuses)


async def release_quietly(host: SettleHost, run_id: str) -> None:
    """Give the lease back; a failure is only logged (the lease then simply expires)."""
    try:
        await host.store.release_run_lock(run_id)
    except Exception:
        log.debug("could not release the lease of %s", run_id, exc_info=True)


async def settle_terminal(
    host: SettleHost,
    run: WorkflowRun,
    patch: RunPatch,
    event: EngineEvent,
    completion: dict[str, Any],
    *,
    statuses: tuple[RunStatus, ...] = _LIVE,
) -> bool:
    """The one way a turn ends a run: a conditional write that also drops the lease, then
    the run's event, its parent's completion and a `settled` wake for other processes."""
    final: RunPatch = {**patch, "wake_at": None, "locked_by": None, "locked_until": None}
    final.update(singleton.without_marker(run))
    if not await update_if_status(host, run.id, final, statuses):
        await release_quietly(host, run.id)  # settled elsewhere meanwhile: never resurrect
        return False
    host.events.emit(event)
    host.notify_parent(run, completion)
    host.wakes.announce_soon("settled", run.id)
    woken = await singleton.released(host.store, run)  # its singleton key's next in line
    for waiter in woken:
        host.wakes.announce_soon("ready", waiter)
    if woken:
        host.wakes.kick()  # pick them up here too, now (SQLite has no wake bus)
    return True


def run_event(type_: Any, run: WorkflowRun, **fields: Any) -> EngineEvent:
    """A `run.*` event of `run`; a run's end (`run.completed`, `run.failed`) carries the
    run's life so far as `duration_ms`."""
    if type_ in ("run.completed", "run.failed"):
        at = now_utc()
        fields.setdefault("duration_ms", lived_ms(run.created_at, at))
        fields.setdefault("at", at)
    return EngineEvent(
        type=type_, run_id=run.id, workflow=run.workflow, namespace=run.namespace, **fields
    )


async def settle_completed(host: SettleHost, run: WorkflowRun, output: Any) -> None:
    await settle_terminal(
        host,
        run,
        {"status": "completed", "output": output, "error": None},
        run_event("run.completed", run, output=output),
        {"ok": True, "value": output},
    )


async def settle_failed_unrouted(host: SettleHost, run: WorkflowRun, error: StepError) -> None:
    """Fail the run without looking at its onError routes (the caller already did, or the
    failure is a handler's and final)."""
    await settle_terminal(
        host,
        run,
        {"status": "failed", "error": error},
        run_event("run.failed", run, error=error),
        completion_of_failure(error),
    )
