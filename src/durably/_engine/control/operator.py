"""Operator actions: cancel, retry, continue, redispatch, delete.

Each takes the `ControlPlane` of the client that asks (its store, clock, wake announcements
and — inside an `Engine` — the hooks of the runs this process drives), never an engine."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from durably._core.log_context import durably_logger
from durably._core.models import (
    CHILD_EDGE_PREFIXES,
    HANDOFF_SEQ_BASE,
    LIVE_RUN_STATUSES,
    RunPatch,
    RunResult,
    SignalWaiter,
    StepCheckpoint,
    StepError,
    WorkflowRun,
    replace,
    utc_from_ms,
)
from durably._core.quota import SINGLETON_ADMITTED_TAG
from durably._engine.control import on_error as routing
from durably._engine.defs.vocab import CANCELLED, CANCELLED_COMPLETION
from durably._engine.flow import singleton
from durably._store.protocol import CheckpointStore, SignalStore

if TYPE_CHECKING:
    from durably._engine.control.plane import ControlPlane
    from durably._store.protocol import StateStore

log = durably_logger("durably.engine")

# How many buffered completions of one child a retry looks at to see whether one was a
# success (a child retried that many times without its parent taking one is not plausible).
_PEEK_LIMIT = 1000


def _result(run: WorkflowRun) -> RunResult:
    return RunResult(run.id, run.status, run.output, run.error)


async def cancel(plane: ControlPlane, run_id: str, *, compensate: bool = False) -> RunResult | None:
    """Cancel a run (plain, or compensating for a suspended/running one). Terminal and
    failed runs are returned untouched, with no cascade; `cancelling` is idempotent."""
    run = await plane.store.get_run(run_id)
    if run is None:
        return None
    if run.status in ("completed", "cancelled", "dead", "failed"):
        return _result(run)
    if run.status == "cancelling":
        return RunResult(run.id, "cancelling")
    if compensate and run.status in ("suspended", "running"):
        return await _compensating_cancel(plane, run)
    if await cancel_with(plane, run, CANCELLED):
        return RunResult(run.id, "cancelled", error=CANCELLED)
    fresh = await plane.store.get_run(run_id)
    return _result(fresh) if fresh else None


async def _compensating_cancel(plane: ControlPlane, run: WorkflowRun) -> RunResult | None:
    """Write `cancelling`, wake the run so its turn reaches an exit and
    unwinds (saga.compensate_and_cancel), cascade compensating cancel to the children."""
    patch: RunPatch = {"status": "cancelling", "wake_at": None}
    if not await plane.store.update_run_if_status(run.id, patch, ("suspended", "running")):
        fresh = await plane.store.get_run(run.id)
        return _result(fresh) if fresh else None
    if not plane.request_cancel(run.id):
        await plane.run_ready(run.id)
    for child_id in await get_run_children(plane.store, run.id):
        try:
            await cancel(plane, child_id, compensate=True)
        except Exception:
            log.exception("cancel cascade to %s failed", child_id)
    return RunResult(run.id, "cancelling")


async def cancel_with(plane: ControlPlane, run: WorkflowRun, error: StepError) -> bool:
    """Plain cancel: write `cancelled`, stop a local turn, cascade to children."""
    patch: RunPatch = {
        "status": "cancelled",
        "error": error,
        "wake_at": None,
        "locked_by": None,
        "locked_until": None,
        **singleton.without_marker(run),
    }
    if not await plane.store.update_run_if_status(run.id, patch, LIVE_RUN_STATUSES):
        return False
    plane.stop(run.id)
    plane.run_cancelled(run, error)
    for child_id in await get_run_children(plane.store, run.id):
        try:
            child = await plane.store.get_run(child_id)
            if child is not None and not child.is_terminal and child.status != "failed":
                await cancel_with(plane, child, CANCELLED)
        except Exception:
            log.exception("cancel cascade to %s failed", child_id)
    await plane.announce("settled", run.id)
    for waiter in await singleton.released(plane.store, run, plane.clock()):
        await plane.run_ready(waiter)  # its singleton key's next in line
    await plane.notify_parent(
        run,
        CANCELLED_COMPLETION
        if error is CANCELLED
        else {"ok": False, "error": error.message, "code": error.code},
    )
    return True


def current_task() -> asyncio.Task[Any] | None:
    """The running task, or None outside one (a cancel must not cancel its own caller)."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


class ChildEdgeStore(SignalStore, CheckpointStore, Protocol):
    """Where a run's children are named: its `child:` waiters and its child-edge rows."""


async def get_run_children(store: ChildEdgeStore, run_id: str) -> list[str]:
    """A run's children: live `child:` waiters of the run ∪ ids its child-edge rows name."""
    ids: dict[str, None] = {}
    for waiter in await store.list_signal_waiters("child:"):
        if waiter.run_id == run_id:
            ids[waiter.token[len("child:") :]] = None
    rows = await store.list_checkpoints_by_name_prefix(run_id, list(CHILD_EDGE_PREFIXES))
    for cp in rows:
        if cp.name.startswith("signal:child:"):
            ids[cp.name[len("signal:child:") :]] = None
        elif cp.name.startswith("spawn:"):
            ids[str(cp.output)] = None
        elif cp.name.startswith("fan:") and isinstance(cp.output, dict):
            prefix = cp.name[len("fan:") :]
            first = int(cp.output.get("first", 0))
            for i in range(first, first + int(cp.output.get("count", 0))):
                ids[f"{prefix}.{i}"] = None
    ids.pop(run_id, None)
    return list(ids)


async def requeue(
    plane: ControlPlane, run_id: str, _visited: set[str] | None = None
) -> RunResult | None:
    """Retry (console "retry"): reset failure state so replay re-executes the failed parts
    (failed children are requeued too), then re-enqueue."""
    visited = _visited if _visited is not None else set()
    if run_id in visited:
        return None
    visited.add(run_id)
    store = plane.store
    run = await store.get_run(run_id)
    if run is None:
        return None
    resurrecting = run.status in ("failed", "dead")
    if resurrecting:
        now = plane.clock()
        cps = await store.list_checkpoints(run_id)
        await _retire_handoff(store, run_id, cps)
        for cp in cps:
            if cp.seq >= HANDOFF_SEQ_BASE:
                continue
            if cp.status == "failed":
                error = cp.error or StepError(message="failed")
                await store.save_checkpoint(
                    replace(cp, attempts=0, wake_at=now, error=replace(error, retryable=True))
                )
            elif (
                cp.status == "completed"
                and cp.name.startswith("signal:child:")
                and isinstance(cp.output, dict)
                and cp.output.get("ok") is False
            ):
                child_id = cp.name[len("signal:child:") :]
                at = utc_from_ms(now)
                await store.save_checkpoint(
                    replace(
                        cp,
                        status="running",
                        output=None,
                        started_at=at,
                        finished_at=at,
                        enqueued_at=at,
                    )
                )
                # Looked at, not taken: taking the completions to read them and buffering
                # them again lost them to a crash in between.
                buffered = await store.peek_buffered_signals(f"child:{child_id}", _PEEK_LIMIT)
                has_success = any(
                    isinstance(hit.payload, dict) and hit.payload.get("ok") for hit in buffered
                )
                child = await store.get_run(child_id)
                if not has_success and child is not None and child.status in ("failed", "dead"):
                    await requeue(plane, child_id, visited)
    patch: RunPatch = {
        "status": "pending",
        "error": None,
        "locked_by": None,
        "locked_until": None,
        "wake_at": None,
    }
    if resurrecting:
        patch["recovery_attempts"] = 0
    if run.tags and SINGLETON_ADMITTED_TAG in run.tags:  # a retried run queues again
        patch["tags"] = tuple(t for t in run.tags if t != SINGLETON_ADMITTED_TAG)
    await store.update_run(run_id, patch)
    await plane.run_ready(run_id)
    return RunResult(run_id, "pending")


async def _retire_handoff(store: StateStore, run_id: str, cps: list[Any]) -> None:
    """Rename the live handoff row to its retired name (kept for the
    timeline, status unchanged, never followed) — first, before anything else is reset."""
    live = routing.live_handoff(run_id, cps)
    if live is None:
        return
    handler_id = routing.handoff_handler_id(run_id, live)
    assert handler_id is not None
    await store.save_checkpoint(replace(live, name=routing.retired_handoff_name(handler_id)))
    # A waiter left behind by a handler that never completed must not wake the new attempt.
    await store.remove_signal_waiter(
        SignalWaiter(token=f"child:{handler_id}", run_id=run_id, seq=live.seq)
    )


ENGINE_MINTED_TAGS = ("singleton:", "concurrency:", "version:undeclared", "durable:")


def retry_tags(run: WorkflowRun, static: tuple[str, ...]) -> list[str]:
    """The tags a fix-and-replay run inherits: the origin's, minus the engine-minted ones and
    the workflow's declared tags (its start adds those again)."""
    tags = [t for t in (run.tags or ()) if not t.startswith(ENGINE_MINTED_TAGS)]
    return [t for t in tags if t not in set(static)]


async def continue_run(plane: ControlPlane, run_id: str) -> RunResult | None:
    """Release the first pending breakpoint of the run.

    `bp:` tokens are reserved for the engine (an external signal is refused), so the
    release goes through the internal signal path, once the pending row is found."""
    for cp in await plane.store.list_checkpoints(run_id):
        if cp.status == "pending" and cp.name.startswith("breakpoint"):
            return await plane.signal(
                f"bp:{run_id}:{cp.seq}", None, want_result=True, buffer="bounded"
            )
    return None


def redispatch_requested(cp: StepCheckpoint) -> bool:
    """Whether `cp` is a remote attempt `redispatch_pending` asked to be sent again and no
    turn has sent yet.

    The request is written on the row itself (its `wake_at`, unused by a pending remote row,
    holds when it was asked), because the process asking may have no transport to send
    with (a store-only `Client`): the turn that next looks at the row — woken by the re-drive
    that follows — sends the task and clears the mark, so it is sent once per request."""
    return cp.kind == "remote" and cp.status == "pending" and cp.wake_at is not None


async def redispatch_pending(plane: ControlPlane, run_id: str) -> dict[str, Any] | None:
    """Re-send every dispatched-but-unsettled step of the run (at-least-once).

    Each pending remote row becomes its next attempt, marked to be sent
    (`redispatch_requested`); the run is then re-driven, and its turn sends the task. The
    lost dispatch's late answer names the old attempt, so it cannot settle the row.
    """
    run = await plane.store.get_run(run_id)
    if run is None:
        return None
    count = 0
    now_ms = plane.clock()
    now = utc_from_ms(now_ms)
    for cp in await plane.store.list_checkpoints(run_id):
        if cp.kind == "remote" and cp.status == "pending":
            again = replace(
                cp,
                attempts=cp.attempts + 1,
                wake_at=now_ms,
                enqueued_at=now,
                started_at=now,
                finished_at=now,
            )
            # Compare-and-set: a result that lands meanwhile settles the row and wins.
            if await plane.store.save_checkpoint_if_pending(again):
                count += 1
    if count and not run.is_terminal:
        await plane.redrive(run_id)
    return {"runId": run_id, "status": run.status, "redispatched": count}


async def delete_run(plane: ControlPlane, run_id: str) -> int:
    """Delete the run and its children depth-first; the number deleted."""
    run = await plane.store.get_run(run_id)
    if run is None:
        return 0
    deleted = 0
    for child_id in await get_run_children(plane.store, run_id):
        deleted += await delete_run(plane, child_id)
    plane.stop(run_id)
    await plane.store.delete_run(run_id)
    return deleted + 1
