"""Background work of a driving engine: pick-up, recovery, timers, leases, drain."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from durably._core.models import StepError, WorkflowRun, replace
from durably._engine import operator, signals
from durably._engine.events import EngineEvent
from durably._engine.settle import settle_terminal, update_if_status

if TYPE_CHECKING:
    from durably._engine.engine import Engine

log = logging.getLogger("durably")


async def poll_loop(engine: Engine) -> None:
    """Every `timer_poll_ms`, never overlapping: pending → recovery →
    due timers → execution timeouts. The first pass runs at once (boot recovery)."""
    while True:
        try:
            await poll_once(engine)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("durably poller pass failed; retrying on the next tick")
        await asyncio.sleep(engine.timer_poll_ms / 1000.0)


async def poll_once(engine: Engine) -> None:
    if engine.draining:
        return
    await run_pending(engine)
    await recover_incomplete(engine)
    await resume_due_timers(engine)
    await sweep_timeouts(engine)
    await signals.sweep_expired_signals(engine)  # at most once a minute


async def run_pending(engine: Engine) -> int:
    """Pick up pending runs, oldest first, each under a lease.

    With `claim_pending_runs` the lease is taken in batches by one statement
    (`FOR UPDATE SKIP LOCKED` on PostgreSQL), so engines sharing a database split the
    backlog instead of racing for the same rows; at most `max_concurrent_runs` run here.
    """
    if engine.draining:
        return 0
    claim = engine.store.claim_pending_runs
    claimed = await _claim_local_backlog(engine)
    if engine.pending_backlog:
        return claimed  # no room left: the end of a turn kicks the next pick-up
    while not engine.draining:
        room = engine.max_concurrent_runs - len(engine.executions) - len(engine.dispatching)
        batch = min(engine.claim_batch, room)
        if batch <= 0:
            # Full: the end of a turn kicks another pick-up (engine.dispatch), so a wide
            # fan's pending children keep flowing without waiting for the next poll.
            engine.pending_backlog = True
            break
        engine.pending_backlog = False
        now = engine.clock()
        runs = await claim(engine.instance_id, now + engine.lease_ms, now, batch, engine.namespace)
        for run in runs:
            engine.dispatch(run.id, claimed=run)
        claimed += len(runs)
        if len(runs) < batch:
            break
        await asyncio.sleep(0)  # let other engines (and our own turns) take their share
    return claimed


async def _claim_local_backlog(engine: Engine) -> int:
    """Claim, by id, the runs this engine created and queued for itself (a wide fan's
    children, children.create_children): primary-key lookups instead of a scan of the
    pending backlog. Ids another engine took meanwhile are simply not returned."""
    backlog = engine.local_backlog
    claim = engine.store.claim_runs
    claimed = 0
    engine.pending_backlog = False
    while backlog and not engine.draining:
        room = engine.max_concurrent_runs - len(engine.executions) - len(engine.dispatching)
        if room <= 0:
            engine.pending_backlog = True
            break
        ids = [backlog.popleft() for _ in range(min(room, len(backlog), 1000))]
        now = engine.clock()
        runs = await claim(ids, engine.instance_id, now + engine.lease_ms, now)
        for run in runs:
            engine.dispatch(run.id, claimed=run)
        claimed += len(runs)
    return claimed


async def recover_orphaned_suspended(engine: Engine) -> int:
    """Re-drive `suspended` runs whose holder died while their bodies were parked
    in its memory (resident runs keep their lease while they wait): at once, instead of at
    their `wakeAt` — for a signal or child wait the reconcile fallback, minutes away. A
    re-driven run replays and waits again; a wait that is still pending costs one replay."""
    if engine.draining or not engine.drive_runs:
        return 0
    count = 0
    store = engine.store
    for run in await store.list_orphaned_suspended(
        engine.clock(), engine.namespace, engine.pending_batch
    ):
        if run.id not in engine.executions and run.id not in engine.dispatching:
            engine.dispatch(run.id)  # run_one leases it (the old lease lapsed) and replays
            count += 1
    return count


async def recover_incomplete(engine: Engine) -> int:
    """Re-enqueue `running`/`cancelling` runs whose owner's lease lapsed (the owner
    crashed), counting a recovery attempt; past `max_recovery_attempts` a run is dead."""
    if engine.draining:
        return 0
    store = engine.store
    recovered = await recover_orphaned_suspended(engine)
    for run in await store.list_incomplete_runs(engine.namespace):
        if run.id in engine.executions or run.id in engine.dispatching:
            continue
        now = engine.clock()
        if run.locked_until is not None and run.locked_until > now:
            continue  # a live turn owns it (saves a write per poll)
        leased = await _lease_fresh(engine, run.id, now)
        if leased is None:
            continue
        if leased.status not in ("running", "cancelling"):
            # The listing was stale: the run settled (or was re-enqueued) meanwhile, and a
            # settled run's lease is free. Never resurrect it.
            await store.release_run_lock(run.id)
            continue
        run = leased
        attempts = (run.recovery_attempts or 0) + 1
        cap = engine.max_recovery_attempts
        if cap is not None and attempts > cap:
            # Dead-letter a poison pill: a run that keeps crashing its owner.
            error = StepError(
                message=f"run exceeded maxRecoveryAttempts ({cap}) — moved to dead-letter",
                code="max_recovery_attempts",
            )
            dead = await settle_terminal(
                engine,
                run,
                {"status": "dead", "error": error, "recovery_attempts": attempts},
                EngineEvent(
                    type="run.failed",
                    run_id=run.id,
                    workflow=run.workflow,
                    namespace=run.namespace,
                    error=error,
                ),
                {"ok": False, "error": error.message, "code": error.code},
                statuses=(run.status,),
            )
            if dead:
                engine.fire_dead(
                    replace(run, status="dead", error=error, recovery_attempts=attempts)
                )
            continue
        status = "pending" if run.status == "running" else run.status
        written = await update_if_status(
            engine,
            run.id,
            {
                "status": status,
                "recovery_attempts": attempts,
                "locked_by": None,
                "locked_until": None,
            },
            (run.status,),
        )
        if not written:
            await store.release_run_lock(run.id)
            continue
        log.info("recovered run %s (attempt %d)", run.id, attempts)
        engine.dispatch(run.id)
        recovered += 1
    return recovered


async def _lease_fresh(engine: Engine, run_id: str, now: int) -> WorkflowRun | None:
    """Lease a run and read it as it is NOW (one statement with `claim_run`)."""
    until = now + engine.lease_ms
    return await engine.store.claim_run(run_id, engine.instance_id, until, now)


async def resume_due_timers(engine: Engine) -> int:
    """Re-drive suspended runs whose wakeAt is due."""
    if engine.draining:
        return 0
    due = await engine.store.list_due_timers(
        engine.clock(), engine.namespace, engine.pending_batch * 10
    )
    count = 0
    for run in due:
        execution = engine.executions.get(run.id)
        if execution is not None:
            if execution.resident:
                execution.deliver(None, None)  # re-check what it waits for
            continue
        if run.locked_until is not None and run.locked_until > engine.clock():
            continue  # resident on another instance; its own poller wakes it
        engine.dispatch(run.id)
        count += 1
    return count


async def sweep_timeouts(engine: Engine) -> int:
    """Cancel runs older than their workflow's `execution_timeout`."""
    swept = 0
    now = engine.clock()
    seen: set[str] = set()
    for wf in engine.registered_workflows():
        timeout = wf.execution_timeout_ms
        if timeout is None or wf.name in seen:
            continue
        seen.add(wf.name)
        runs = await engine.list_runs(
            workflow=wf.name, statuses=["running", "suspended"], namespace=engine.namespace
        )
        for run in runs:
            created_ms = int(run.created_at.timestamp() * 1000)
            if created_ms <= now - timeout:
                error = StepError(message="execution timeout", code="execution_timeout")
                if await operator.cancel_with(engine._plane, run, error):
                    swept += 1
    return swept


async def lease_loop(engine: Engine) -> None:
    """Renew the leases of every run this instance drives: ONE statement per interval
    (durably `renew_run_locks`), falling back to one renewal per run."""
    interval = max(50, engine.lease_ms // 2) / 1000.0
    while True:
        await asyncio.sleep(interval)
        try:
            await renew_leases(engine)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("durably lease renewal failed")


async def renew_leases(engine: Engine) -> None:
    held = list(engine.executions)
    if not held:
        return
    until = engine.clock() + engine.lease_ms
    renewed = await engine.store.renew_run_locks(engine.instance_id, until)
    if renewed >= len(held):
        return
    lost: list[str] = []
    for run_id in held:
        if run_id not in engine.executions:
            continue
        run = await engine.store.get_run(run_id)
        if run is not None and run.locked_by != engine.instance_id and run_id in engine.executions:
            lost.append(run_id)
    for run_id in lost:
        execution = engine.executions.get(run_id)
        if execution is None:
            continue
        # Another instance owns the run now: stop driving it here (no more writes).
        log.warning("lost the lease of run %s; dropping it on this instance", run_id)
        execution.cancelled = True
        execution.evict()
        if execution.task is not None:
            execution.task.cancel()


async def drain(engine: Engine, timeout: float) -> None:
    """Stop taking work; parked runs are evicted (they are durably
    suspended and their leases released so another instance can take them at once); turns
    still executing get `timeout` seconds, then are cancelled and their leases released."""
    engine.draining = True
    for execution in list(engine.executions.values()):
        if execution.is_parked:
            execution.evict()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while engine.executions or engine.dispatching:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        for execution in list(engine.executions.values()):
            if execution.is_parked:
                execution.evict()
        await asyncio.sleep(min(0.02, remaining))
    for run_id, execution in list(engine.executions.items()):
        execution.cancelled = True
        if execution.task is not None:
            execution.task.cancel()
        try:
            await engine.store.release_run_lock(run_id)
        except Exception:
            log.debug("could not release %s during drain", run_id, exc_info=True)
    # Let background notifications (child completions, deliveries) finish briefly, and the
    # ones they start meanwhile (a cancelled child's completion starts a mailbox delivery).
    settle_by = loop.time() + max(0.0, min(1.0, deadline - loop.time()))
    while True:
        pending = [t for t in engine._tasks if not t.done()]
        remaining = settle_by - loop.time()
        if not pending or remaining <= 0:
            break
        await asyncio.wait(pending, timeout=remaining)
