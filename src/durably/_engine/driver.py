"""Driving runs: lease → one turn (resident or replay) → settle."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from durably._core.errors import (
    ContinueAsNew,
    InputValidationError,
    RunEvicted,
    SerializationError,
    WorkflowSuspended,
    error_of,
)
from durably._core.models import (
    TERMINAL_RUN_STATUSES,
    RunPatch,
    StepCheckpoint,
    StepError,
    WorkflowRun,
    replace,
)
from durably._engine import routing, saga
from durably._engine.ctx import WorkflowCtx
from durably._engine.events import EngineEvent
from durably._engine.execution import AMBIENT_CTX, Execution, ReplayNow, StoreFailure
from durably._engine.registry import Workflow
from durably._engine.settle import (
    release_quietly,
    run_event,
    settle_completed,
    settle_failed_unrouted,
    settle_terminal,
    update_if_live,
)
from durably._engine.typed_io import validation_details
from durably._engine.vocab import next_continuation_id

if TYPE_CHECKING:
    from durably._engine.engine import Engine

log = logging.getLogger("durably")


async def run_one(engine: Engine, run_id: str) -> bool:
    """Lease the run, then execute one turn on this instance.

    Returns False when the lease could not be taken (another instance holds it).
    """
    if run_id in engine.executions:
        return True
    if engine.draining:
        return False
    now = engine.clock()
    lease_until = now + engine.lease_ms
    run = await engine.store.claim_run(run_id, engine.instance_id, lease_until, now)
    if run is None:
        return False
    if run_id in engine.executions:  # raced with another local dispatch
        return True
    await drive(engine, run)
    return True


async def drive(engine: Engine, run: WorkflowRun) -> None:
    """Execute one turn of a run whose lease this instance holds."""
    try:
        prepared = await _prepare_turn(engine, run)
    except Exception as exc:
        # The store failed before the turn began: give the lease back so the run is
        # retried at once once the store answers again, not a whole lease later.
        log.warning("run %s: could not start its turn (%s); it will be retried", run.id, exc)
        await release_quietly(engine, run.id)
        return
    if prepared is None:
        return
    # A routed run follows its handoff; the body is NOT run again.
    if routing.live_handoff(run.id, prepared[2]) is not None:
        try:
            await routing.follow_handoff(engine, prepared[0], prepared[2])
        except Exception as exc:
            log.warning("run %s: could not follow its onError handoff (%s)", run.id, exc)
            await release_quietly(engine, run.id)
        return
    execution = Execution(engine, *prepared)
    engine.executions[run.id] = execution
    task = asyncio.current_task()
    execution.task = task
    try:
        await _turn(engine, execution)
    finally:
        engine.executions.pop(run.id, None)
        engine.turn_finished()


async def _prepare_turn(
    engine: Engine, run: WorkflowRun
) -> tuple[WorkflowRun, Workflow[Any, Any], list[StepCheckpoint]] | None:
    """Mark the run running and load its history; None when the turn must not run."""
    store = engine.store
    if run.status in TERMINAL_RUN_STATUSES or (
        engine.namespace is not None and run.namespace not in (engine.namespace, None)
    ):
        await store.release_run_lock(run.id)
        return None
    # An empty version: started by name without one, by a process without the workflow's
    # code (`durably.Client`) — this engine's newest registered version runs it.
    workflow = engine.registration(run.workflow, run.workflow_version or None)
    if workflow is None:
        # Not registered here: the run waits (the prior version must stay deployed so
        # in-flight runs drain).
        log.error(
            "run %s needs workflow %s@%s, which is not registered on this engine — keep the "
            "prior version deployed so in-flight runs can drain",
            run.id,
            run.workflow,
            run.workflow_version,
        )
        await store.release_run_lock(run.id)
        return None
    fresh = engine.fresh_runs.pop(run.id, False)
    if run.status == "pending":
        started: RunPatch = {"status": "running"}
        if not run.workflow_version:
            # Pin the version it runs now, so every later turn (on any worker) replays it.
            started["workflow_version"] = workflow.version
            run = replace(run, workflow_version=workflow.version)
        if not await update_if_live(engine, run.id, started):
            await store.release_run_lock(run.id)  # cancelled between claim and start
            return None
        run = replace(run, status="running")
        engine.events.emit(
            EngineEvent(
                type="run.started", run_id=run.id, workflow=run.workflow, namespace=run.namespace
            )
        )
    elif run.status in ("suspended", "blocked"):
        # durably: a re-driven run reads `running` while its turn executes, so a crash in
        # the turn is found by recovery at once instead of at its old wakeAt.
        if not await update_if_live(engine, run.id, {"status": "running", "wake_at": None}):
            await store.release_run_lock(run.id)
            return None
        run = replace(run, status="running", wake_at=None)
    # A run this instance created a moment ago has no checkpoints yet: skip the read.
    checkpoints = [] if fresh else await store.list_checkpoints(run.id)
    return run, workflow, checkpoints


async def _turn(engine: Engine, ex: Execution) -> None:
    ctx = WorkflowCtx(ex)
    workflow = ex.workflow
    token = AMBIENT_CTX.set(ctx)
    try:
        input_value = _decode_input(workflow, ex.run.input)
        result = await workflow.invoke(ctx, input_value)
    except ReplayNow:
        await ex.close()
        await engine.store.release_run_lock(ex.run_id)
        engine.dispatch(ex.run_id)
        return
    except StoreFailure as failure:
        await ex.close()
        log.error(
            "run %s: the store failed during its turn (%s); the run resumes from its last "
            "checkpoint once the store is back",
            ex.run_id,
            failure.cause,
        )
        await release_quietly(engine, ex.run_id)
        return
    except RunEvicted:
        await ex.close()
        if ex.cancel_requested and not ex.cancelled:
            await saga.compensate_and_cancel(engine, ex)
            return
        if not ex.cancelled:
            await engine.store.release_run_lock(ex.run_id)
        return
    except WorkflowSuspended as suspended:
        await ex.close()
        if ex.cancel_requested:  # cancel-requested wins over any outcome
            await saga.compensate_and_cancel(engine, ex)
            return
        await _settle_suspended(engine, ex, suspended.wake_at)
        return
    except ContinueAsNew as cont:
        await ex.close()
        if ex.cancel_requested:
            await saga.compensate_and_cancel(engine, ex)
            return
        await _settle_continued(engine, ex, cont.input)
        return
    except asyncio.CancelledError:
        if ex.cancelled:
            return  # engine.cancel wrote the outcome and released the lease
        await release_quietly(engine, ex.run_id)
        raise
    except Exception as exc:
        await ex.close()
        if ex.cancelled:
            return
        if ex.cancel_requested:
            await saga.compensate_and_cancel(engine, ex)
            return
        # Unwind the saga BEFORE settle(failed) and its onError routing; the run fails
        # with the ORIGINAL error.
        if ex.compensations and not await saga.unwind(ex):
            await release_quietly(engine, ex.run_id)  # store failed: recovery re-drives
            return
        await settle_failed(engine, ex.run, error_of(exc))
        return
    finally:
        AMBIENT_CTX.reset(token)
    await ex.close()
    if ex.cancelled:
        return
    if ex.cancel_requested:
        await saga.compensate_and_cancel(engine, ex)
        return
    try:
        output = workflow.output_codec.to_json(result)
    except SerializationError as exc:
        await settle_failed(
            engine,
            ex.run,
            StepError(
                message=f"workflow {workflow.name!r} returned a value that cannot be stored: {exc}",
                code="serialization",
            ),
        )
        return
    await settle_completed(engine, ex.run, output)


def _decode_input(workflow: Workflow[Any, Any], stored: Any) -> Any:
    """The body's input from its stored JSON. A run started by name by a process without the
    workflow's code was not validated at its start: an input that does not fit the
    annotation fails the run with `InputValidationError`, naming what is wrong."""
    try:
        return workflow.input_codec.from_json(stored)
    except ValidationError as exc:
        raise InputValidationError(
            workflow.name, str(exc).replace("\n", "; "), validation_details(exc)
        ) from None


async def settle_failed(engine: Engine, run: WorkflowRun, error: StepError) -> None:
    # onError routing first; a failure settled by follow_handoff is final and never
    # routed again (it calls settle.settle_failed_unrouted directly).
    if await routing.route_failure(engine, run, error):
        return
    await settle_failed_unrouted(engine, run, error)


async def _settle_suspended(engine: Engine, ex: Execution, wake_at: int | None) -> None:
    """Settle `suspended` (the reconcile fallback wake when there is no natural one),
    unless the run was settled meanwhile; then the lost-wake guard below."""
    natural = wake_at if wake_at is not None else engine.fallback_wake_at()
    patch: RunPatch = {
        "status": "suspended",
        "wake_at": natural,
        "locked_by": None,
        "locked_until": None,
    }
    if not await update_if_live(engine, ex.run_id, patch):
        await release_quietly(engine, ex.run_id)
        return
    engine.events.emit(
        EngineEvent(
            type="run.suspended",
            run_id=ex.run_id,
            workflow=ex.run.workflow,
            namespace=ex.run.namespace,
        )
    )
    engine.wakes.announce_soon("settled", ex.run_id)
    # A delivery that raced this turn found the lease taken and only nudged `wakeAt`,
    # which the write above may have overwritten: look at the awaited rows once more.
    if len(ex.waiting_seqs) > 8:
        # A fan waits on many rows: one listing instead of a read per member.
        rows = await engine.store.list_checkpoints(ex.run_id)
        if any(cp.seq in ex.waiting_seqs and cp.status == "completed" for cp in rows):
            engine.dispatch(ex.run_id)
        return
    for seq in sorted(ex.waiting_seqs):
        cp = await engine.store.get_checkpoint(ex.run_id, seq)
        if cp is not None and cp.status == "completed":
            engine.dispatch(ex.run_id)
            return


async def _settle_continued(engine: Engine, ex: Execution, new_input: Any) -> None:
    """ContinueAsNew: complete (no output) and start `<id>~N` unpinned (newest version)."""
    run = ex.run
    completed = await settle_terminal(
        engine,
        run,
        {"status": "completed", "output": None, "error": None},
        run_event("run.completed", run),
        {"ok": True, "value": None},
    )
    if completed:
        engine.spawn(
            engine.start_raw(
                run.workflow,
                new_input,
                next_continuation_id(run.id),
                namespace=run.namespace,
                tags=run.tags,
            )
        )
