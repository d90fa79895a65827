"""Operator actions: cancel, retry, continue, redispatch, delete."""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

from durably._core.ids import given_run_id
from durably._core.models import (
    CHILD_EDGE_PREFIXES,
    HANDOFF_SEQ_BASE,
    RunPatch,
    RunResult,
    SignalWaiter,
    StepError,
    WorkflowRun,
    replace,
    utc_from_ms,
)
from durably._engine import signals
from durably._engine.events import EngineEvent

if TYPE_CHECKING:
    from durably._engine.engine import Engine

log = logging.getLogger("durably")

CANCELLED = StepError(message="cancelled")
# Decision: a parent awaiting a cancelled child is told, so
# it fails loudly instead of waiting forever.
CANCELLED_COMPLETION = {"ok": False, "error": "cancelled", "code": "cancelled"}


def _result(run: WorkflowRun) -> RunResult:
    return RunResult(run.id, run.status, run.output, run.error)


async def cancel(engine: Engine, run_id: str, *, compensate: bool = False) -> RunResult | None:
    """Cancel a run (plain, or compensating for a suspended/running one). Terminal and
    failed runs are returned untouched, with no cascade; `cancelling` is idempotent."""
    run = await engine.store.get_run(run_id)
    if run is None:
        return None
    if run.status in ("completed", "cancelled", "dead", "failed"):
        return _result(run)
    if run.status == "cancelling":
        return RunResult(run.id, "cancelling")
    if compensate and run.status in ("suspended", "running"):
        return await _compensating_cancel(engine, run)
    if await cancel_with(engine, run, CANCELLED):
        return RunResult(run.id, "cancelled", error=CANCELLED)
    fresh = await engine.store.get_run(run_id)
    return _result(fresh) if fresh else None


async def _compensating_cancel(engine: Engine, run: WorkflowRun) -> RunResult | None:
    """Write `cancelling`, wake the run so its turn reaches an exit and
    unwinds (saga.compensate_and_cancel), cascade compensating cancel to the children."""
    from durably._engine.driver import update_if_status

    patch: RunPatch = {"status": "cancelling", "wake_at": None}
    if not await update_if_status(engine, run.id, patch, ("suspended", "running")):
        fresh = await engine.store.get_run(run.id)
        return _result(fresh) if fresh else None
    execution = engine.executions.get(run.id)
    if execution is not None:
        # A resident turn: end its waits (RunEvicted → the exit runs the unwind); a
        # turn mid-step reaches its next exit non-resident.
        execution.cancel_requested = True
        execution.evict()
    else:
        engine.dispatch(run.id)
    for child_id in await get_run_children(engine, run.id):
        try:
            await cancel(engine, child_id, compensate=True)
        except Exception:
            log.exception("cancel cascade to %s failed", child_id)
    return RunResult(run.id, "cancelling")


async def cancel_with(engine: Engine, run: WorkflowRun, error: StepError) -> bool:
    """Plain cancel: write `cancelled`, stop a local turn, cascade to children."""
    from durably._engine.driver import update_if_live

    patch: RunPatch = {
        "status": "cancelled",
        "error": error,
        "wake_at": None,
        "locked_by": None,
        "locked_until": None,
    }
    if not await update_if_live(engine, run.id, patch):
        return False
    execution = engine.executions.get(run.id)
    if execution is not None:
        execution.cancelled = True
        execution.evict()
        if execution.task is not None and execution.task is not _current_task():
            execution.task.cancel()
    engine.events.emit(
        EngineEvent(
            type="run.failed",
            run_id=run.id,
            workflow=run.workflow,
            namespace=run.namespace,
            error=error,
        )
    )
    for child_id in await get_run_children(engine, run.id):
        try:
            child = await engine.store.get_run(child_id)
            if child is not None and not child.is_terminal and child.status != "failed":
                await cancel_with(engine, child, CANCELLED)
        except Exception:
            log.exception("cancel cascade to %s failed", child_id)
    engine.fire_cancel(run.id)
    engine.wakes.announce_soon("settled", run.id)
    engine.notify_parent(
        run,
        CANCELLED_COMPLETION
        if error is CANCELLED
        else {"ok": False, "error": error.message, "code": error.code},
    )
    return True


def _current_task() -> Any:
    import asyncio

    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


async def get_run_children(engine: Engine, run_id: str) -> list[str]:
    """A run's children: live `child:` waiters of the run ∪ ids its child-edge rows name."""
    ids: dict[str, None] = {}
    for waiter in await engine.store.list_signal_waiters("child:"):
        if waiter.run_id == run_id:
            ids[waiter.token[len("child:") :]] = None
    rows = await engine.store.list_checkpoints_by_name_prefix(run_id, list(CHILD_EDGE_PREFIXES))
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
    engine: Engine, run_id: str, _visited: set[str] | None = None
) -> RunResult | None:
    """Retry (console "retry"): reset failure state so replay re-executes the failed parts
    (failed children are requeued too), then re-enqueue."""
    visited = _visited if _visited is not None else set()
    if run_id in visited:
        return None
    visited.add(run_id)
    store = engine.store
    run = await store.get_run(run_id)
    if run is None:
        return None
    resurrecting = run.status in ("failed", "dead")
    if resurrecting:
        now = engine.clock()
        cps = await store.list_checkpoints(run_id)
        await _retire_handoff(engine, run_id, cps)
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
                buffered = []
                while (hit := await store.take_buffered_signal(f"child:{child_id}")) is not None:
                    buffered.append(hit.payload)
                for payload in buffered:
                    await store.buffer_signal(f"child:{child_id}", payload)
                has_success = any(isinstance(p, dict) and p.get("ok") for p in buffered)
                child = await store.get_run(child_id)
                if not has_success and child is not None and child.status in ("failed", "dead"):
                    await requeue(engine, child_id, visited)
    patch: RunPatch = {
        "status": "pending",
        "error": None,
        "locked_by": None,
        "locked_until": None,
        "wake_at": None,
    }
    if resurrecting:
        patch["recovery_attempts"] = 0
    if run.tags and "durable:singleton:admitted" in run.tags:
        patch["tags"] = tuple(t for t in run.tags if t != "durable:singleton:admitted")
    await store.update_run(run_id, patch)
    engine.dispatch(run_id)
    return RunResult(run_id, "pending")


async def _retire_handoff(engine: Engine, run_id: str, cps: list[Any]) -> None:
    """Rename the live handoff row to its retired name (kept for the
    timeline, status unchanged, never followed) — first, before anything else is reset."""
    from durably._engine import routing

    live = routing.live_handoff(run_id, cps)
    if live is None:
        return
    handler_id = routing.handoff_handler_id(run_id, live)
    assert handler_id is not None
    await engine.store.save_checkpoint(replace(live, name=routing.retired_handoff_name(handler_id)))
    # A waiter left behind by a handler that never completed must not wake the new attempt.
    await engine.store.remove_signal_waiter(
        SignalWaiter(token=f"child:{handler_id}", run_id=run_id, seq=live.seq)
    )


_ENGINE_MINTED = ("singleton:", "concurrency:", "version:undeclared", "durable:")


async def retry_with_input(
    engine: Engine, run_id: str, input: Any, new_run_id: str | None
) -> str | None:
    """Fix-and-replay as a NEW run `<runId>~retry~<8>`; its success is also delivered to
    the origin's parent."""
    given_run_id(new_run_id, what="new run id")  # "" is refused, not made a random id
    run = await engine.store.get_run(run_id)
    if run is None:
        return None
    new_id = new_run_id or f"{run_id}~retry~{uuid.uuid4().hex[:8]}"
    tags = [t for t in (run.tags or ()) if not t.startswith(_ENGINE_MINTED)]
    workflow = engine.registration(run.workflow)
    static = set(workflow.tags) if workflow is not None else set()
    tags = [t for t in tags if t not in static]
    await engine.start(run.workflow, input, run_id=new_id, tags=tags, namespace=run.namespace)
    return new_id


async def continue_run(engine: Engine, run_id: str) -> RunResult | None:
    """Release the first pending breakpoint of the run.

    `bp:` tokens are reserved for the engine (an external `Engine.signal` is refused), so the
    release goes through the internal signal path, once the pending row is found."""
    for cp in await engine.store.list_checkpoints(run_id):
        if cp.status == "pending" and cp.name.startswith("breakpoint"):
            return await signals.signal(
                engine, f"bp:{run_id}:{cp.seq}", None, want_result=True, buffer="bounded"
            )
    return None


async def redispatch_pending(engine: Engine, run_id: str) -> dict[str, Any] | None:
    """Re-send every dispatched-but-unsettled step of the run.

    With the in-process transport an unsettled remote row is re-executed by re-driving the
    run: its turn finds the `pending` row and runs that step again (at-least-once).
    """
    run = await engine.store.get_run(run_id)
    if run is None:
        return None
    count = 0
    now = utc_from_ms(engine.clock())
    for cp in await engine.store.list_checkpoints(run_id):
        if cp.kind == "remote" and cp.status == "pending":
            await engine.store.save_checkpoint(
                replace(
                    cp, attempts=cp.attempts + 1, enqueued_at=now, started_at=now, finished_at=now
                )
            )
            count += 1
    if count and not run.is_terminal:
        await engine.redrive(run_id)
    return {"runId": run_id, "status": run.status, "redispatched": count}


async def delete_run(engine: Engine, run_id: str) -> int:
    """Delete the run and its children depth-first; the number deleted."""
    run = await engine.store.get_run(run_id)
    if run is None:
        return 0
    deleted = 0
    for child_id in await get_run_children(engine, run_id):
        deleted += await delete_run(engine, child_id)
    execution = engine.executions.get(run_id)
    if execution is not None:
        execution.cancelled = True
        execution.evict()
        if execution.task is not None:
            execution.task.cancel()
    await engine.store.delete_run(run_id)
    return deleted + 1
