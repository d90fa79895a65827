"""`Poller`: the background work of a driving engine — pick-up, recovery, timers, leases,
drain.

Every `timer_poll_ms` one pass, never overlapping: pending runs are claimed, runs whose
owner died are recovered, due timers re-driven, execution timeouts swept and expired
buffered signals purged. A wake message (`WakeLink.kick`) runs the pick-up half at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from durably._core.log_context import durably_logger
from durably._core.models import RunQuery, StepError, WorkflowRun, replace
from durably._engine.control import operator, signals
from durably._engine.control.settle import (
    SettleHost,
    run_event,
    settle_terminal,
    update_if_status,
)
from durably._engine.worker import unserved
from durably._engine.worker.runs import BackgroundTasks, DriveState, ExecutingRuns
from durably._store.protocol import LeaseStore, ReadStore, RunStore, ScanStore

if TYPE_CHECKING:
    from durably._engine.control.plane import ControlPlane
    from durably._engine.control.signals import SignalBufferPolicy
    from durably._engine.defs.options import EngineOptions
    from durably._engine.defs.registry import Workflow
    from durably._engine.run.execution import Execution

log = durably_logger("durably.worker")


class PollerStore(ScanStore, LeaseStore, RunStore, ReadStore, signals.ExpiringBuffers, Protocol):
    """What the poller asks of the store: the pick-up scans and the leases they lead to, the
    runs it re-reads, the lists of its sweeps (blocked runs, timeouts) and the purge of
    expired buffers."""


# At most this many workflow names asked of the workers' liveness per poll, when parked runs
# are looked at for convention routing: each may be a round trip to the transport.
_CONVENTION_CHECKS = 20


class PolledRuns(ExecutingRuns, DriveState, BackgroundTasks, Protocol):
    """What the poller asks of the runs here: how much room is left, which runs it holds
    already, to run a turn (of a run it may have leased already), the executions whose
    leases it renews, and the drain."""

    @property
    def load(self) -> int:
        """Turns counted against `max_concurrent_runs`."""
        ...

    @property
    def busy(self) -> bool:
        """A turn executes or is being dispatched here."""
        ...

    def holds(self, run_id: str) -> bool:
        """A turn of the run executes here or is being dispatched here."""
        ...

    def dispatch(
        self, run_id: str, *, nudge: bool = False, claimed: WorkflowRun | None = None
    ) -> None: ...

    def executions(self) -> list[Execution]: ...

    def executing_ids(self) -> list[str]: ...

    def begin_drain(self) -> None: ...

    def pending_tasks(self) -> list[asyncio.Task[Any]]: ...


class Poller:
    """Claims, recovers and re-drives runs for one engine; renews its leases; drains it."""

    def __init__(
        self,
        store: PollerStore,
        runs: PolledRuns,
        *,
        settle: SettleHost,
        plane: ControlPlane,
        options: EngineOptions,
        clock: Callable[[], int],
        instance_id: str,
        namespace: str | None,
        signal_buffer: SignalBufferPolicy,
        workflows: Callable[[], list[Workflow[Any, Any]]],
        on_dead: Callable[[WorkflowRun], None],
        dead_letter: Callable[[WorkflowRun, StepError], Awaitable[str | None]] | None = None,
    ):
        self._store = store
        self._runs = runs
        self._settle = settle
        self._plane = plane
        self._options = options
        self._clock = clock
        self._instance_id = instance_id
        self._namespace = namespace
        self._signal_buffer = signal_buffer
        self._workflows = workflows
        self._on_dead = on_dead
        self._dead_letter = dead_letter
        # run_pending stopped for lack of room: the end of a turn starts the next pick-up.
        self._backlogged = False
        # Runs created here (a wide fan's children) to claim by id.
        self._local_backlog: deque[str] = deque()
        # One pick-up pass at a time: the poll loop and a wake's kick would otherwise both
        # count the same free room while their claims are in flight, and together lease
        # more runs than `max_concurrent_runs` (and in no single pick-up order). A request
        # during a pass makes that pass go round once more rather than wait its turn.
        self._picking = False
        self._pick_again = False
        # Room promised to claims in flight: two claims of the local backlog (every caller
        # makes one) would otherwise count the same free room, and the second would lease
        # runs only to give them back.
        self._reserved = 0
        # With workflow workers: whether a live worker serves a workflow name by convention
        # (a closed set of registered names is then not all this engine can serve).
        self._by_convention: Callable[[str, str | None], Awaitable[bool]] | None = None
        # Parked runs due for a re-check, taken one at a time by one task (_queue_recheck).
        self._recheck_queue: deque[str] = deque()
        self._rechecking: set[str] = set()
        self._recheck_task: asyncio.Task[None] | None = None
        # Passes other parts of the engine add to every poll (the static schedules).
        self._passes: list[Callable[[], Awaitable[object]]] = []

    def add_pass(self, run: Callable[[], Awaitable[object]]) -> None:
        """Run `run` at the end of every poll pass (after timers and the timeout sweep)."""
        self._passes.append(run)

    def serve_by_convention(self, serves: Callable[[str, str | None], Awaitable[bool]]) -> None:
        """Connected by the worker when it routes workflows to remote workers by convention:
        parked runs such a worker serves are then taken at the next poll as well."""
        self._by_convention = serves

    @property
    def backlogged(self) -> bool:
        """Pending work was left for lack of room: the end of a turn should pick it up."""
        return self._backlogged

    def queue_claim(self, run_id: str) -> None:
        """A run this process created, to claim by id at the next pick-up."""
        self._local_backlog.append(run_id)

    def _room(self) -> int:
        return self._options.max_concurrent_runs - self._runs.load - self._reserved

    async def pickup(self) -> None:
        """The pick-up half of a pass: pending runs, then due timers."""
        await self.run_pending()
        await self.resume_due_timers()

    # ------------------------------------------------------------------ the loop

    async def poll_loop(self) -> None:
        """Every `timer_poll_ms`, never overlapping: pending → recovery → due timers →
        execution timeouts. The first pass runs at once (boot recovery)."""
        while True:
            try:
                await self.poll_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("durably poller pass failed; retrying on the next tick")
            await asyncio.sleep(self._options.timer_poll_ms / 1000.0)

    async def poll_once(self) -> None:
        if self._runs.draining:
            return
        await self.run_pending()
        await self.recover_incomplete()
        await self.resume_due_timers()
        await self.rescue_unserved()
        await self.sweep_timeouts()
        for run in self._passes:
            await run()
        # at most once a minute
        await signals.sweep_expired_signals(self._store, self._signal_buffer, self._clock)

    # ------------------------------------------------------------------ pick-up

    async def run_pending(self) -> int:
        """Pick up pending runs, higher priority first, then oldest, each under a lease.

        The lease is taken in batches by one statement (`FOR UPDATE SKIP LOCKED` on
        PostgreSQL), so engines sharing a database split the backlog instead of racing for
        the same rows; at most `max_concurrent_runs` run here.
        """
        here = self._runs
        if here.draining:
            return 0
        # The runs this engine created for itself (a wide fan's children) are claimed by id
        # at once, by every caller: serialising them would make a fan's members trickle in.
        claimed = await self._claim_local_backlog()
        if self._backlogged:
            return claimed  # no room left: the end of a turn kicks the next pick-up
        if self._picking:
            # A claim of the shared backlog is running: it goes round once more when it
            # ends, instead of a second one counting the same free room at the same time
            # (which would lease more than `max_concurrent_runs`, in no single order).
            self._pick_again = True
            return claimed
        self._picking = True
        try:
            while True:
                self._pick_again = False
                claimed += await self._claim_backlog()
                if not self._pick_again or here.draining:
                    return claimed
        finally:
            self._picking = False

    async def _claim_backlog(self) -> int:
        """Claim pending runs in pick-up order while there is room (one pass)."""
        here = self._runs
        claimed = 0
        while not here.draining:
            batch = min(self._options.claim_batch, self._room())
            if batch <= 0:
                # Full: the end of a turn kicks another pick-up, so a wide fan's pending
                # children keep flowing without waiting for the next poll.
                self._backlogged = True
                break
            self._backlogged = False
            now = self._clock()
            self._reserved += batch
            try:
                runs = await self._store.claim_pending_runs(
                    self._instance_id, now + self._options.lease_ms, now, batch, self._namespace
                )
            finally:
                self._reserved -= batch
            surplus = await self._dispatch_claimed(runs)
            claimed += len(runs) - len(surplus)
            if surplus:
                self._backlogged = True
                break
            if len(runs) < batch:
                break
            await asyncio.sleep(0)  # let other engines (and our own turns) take their share
        return claimed

    async def _claim_local_backlog(self) -> int:
        """Claim, by id, the runs this engine created and queued for itself (a wide fan's
        children, children.create_children): primary-key lookups instead of a scan of the
        pending backlog. Ids another engine took meanwhile are simply not returned."""
        backlog = self._local_backlog
        here = self._runs
        claimed = 0
        self._backlogged = False
        while backlog and not here.draining:
            room = self._room()
            if room <= 0:
                self._backlogged = True
                break
            ids = [backlog.popleft() for _ in range(min(room, len(backlog), 1000))]
            now = self._clock()
            self._reserved += len(ids)
            try:
                runs = await self._store.claim_runs(
                    ids, self._instance_id, now + self._options.lease_ms, now
                )
            finally:
                self._reserved -= len(ids)
            surplus = await self._dispatch_claimed(runs)
            claimed += len(runs) - len(surplus)
            if surplus:
                backlog.extendleft(reversed(surplus))  # still ours to claim by id, first
                self._backlogged = True
                break
        return claimed

    async def _dispatch_claimed(self, runs: list[WorkflowRun]) -> list[str]:
        """Dispatch the runs a claim leased, as far as there is room now; the leases of the
        rest are given back at once (they are pending again) and their ids returned.

        The room was counted before the claim's round trip, and a start made here meanwhile
        may have taken some of it (a start with room runs at once): dispatching everything
        would then run more than `max_concurrent_runs`."""
        here = self._runs
        surplus: list[str] = []
        for run in runs:
            # A run already being dispatched here is one more turn of it, not more load.
            if here.holds(run.id) or self._room() > 0:
                here.dispatch(run.id, claimed=run)
            else:
                surplus.append(run.id)
        for run_id in surplus:
            await self._store.release_run_lock(run_id)
        return surplus

    # ------------------------------------------------------------------ recovery

    async def recover_orphaned_suspended(self) -> int:
        """Re-drive `suspended` runs whose holder died while their bodies were parked in its
        memory (resident runs keep their lease while they wait): at once, instead of at
        their `wakeAt` — for a signal or child wait the reconcile fallback, minutes away. A
        re-driven run replays and waits again; a wait that is still pending costs one
        replay."""
        here = self._runs
        if here.draining or not here.drive_runs:
            return 0
        count = 0
        for run in await self._store.list_orphaned_suspended(
            self._clock(), self._namespace, self._options.pending_batch
        ):
            if not here.holds(run.id):
                here.dispatch(run.id)  # run_one leases it (the old lease lapsed)
                count += 1
        return count

    async def recover_incomplete(self) -> int:
        """Re-enqueue `running`/`cancelling` runs whose owner's lease lapsed (the owner
        crashed), counting a recovery attempt; past `max_recovery_attempts` a run is dead."""
        here = self._runs
        if here.draining:
            return 0
        store = self._store
        recovered = await self.recover_orphaned_suspended()
        for run in await store.list_incomplete_runs(self._namespace):
            if here.holds(run.id):
                continue
            now = self._clock()
            if run.locked_until is not None and run.locked_until > now:
                continue  # a live turn owns it (saves a write per poll)
            # Lease it and read it as it is NOW (one statement).
            leased = await store.claim_run(
                run.id, self._instance_id, now + self._options.lease_ms, now
            )
            if leased is None:
                continue
            if leased.status not in ("running", "cancelling"):
                # The listing was stale: the run settled (or was re-enqueued) meanwhile, and
                # a settled run's lease is free. Never resurrect it.
                await store.release_run_lock(run.id)
                continue
            if await self._recover(leased):
                recovered += 1
        return recovered

    async def _recover(self, run: WorkflowRun) -> bool:
        """Count one recovery attempt of a leased orphan and re-drive it, or dead-letter it
        past the cap. True when it was re-driven."""
        attempts = (run.recovery_attempts or 0) + 1
        cap = self._options.max_recovery_attempts
        if cap is not None and attempts > cap:
            # Dead-letter a poison pill: a run that keeps crashing its owner.
            error = StepError(
                message=f"run exceeded maxRecoveryAttempts ({cap}) — moved to dead-letter",
                code="max_recovery_attempts",
            )
            # Its dead-letter run first (idempotent by id): a crash between the two writes
            # leaves the run to be given up on again, and never a dead run without its
            # handler. The handler's id goes in the error's details (the console links it).
            handler = await self._dead_letter(run, error) if self._dead_letter else None
            if handler is not None:
                error = replace(error, details={"deadLetterRun": handler})
            dead = await settle_terminal(
                self._settle,
                run,
                {"status": "dead", "error": error, "recovery_attempts": attempts},
                run_event("run.failed", run, error=error),
                {"ok": False, "error": error.message, "code": error.code},
                statuses=(run.status,),
            )
            if dead:
                self._on_dead(replace(run, status="dead", error=error, recovery_attempts=attempts))
            return False
        status = "pending" if run.status == "running" else run.status
        written = await update_if_status(
            self._settle,
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
            await self._store.release_run_lock(run.id)
            return False
        log.info("recovered run %s (attempt %d)", run.id, attempts)
        self._runs.dispatch(run.id)
        return True

    # ------------------------------------------------------------------ timers

    async def resume_due_timers(self) -> int:
        """Re-drive suspended runs whose wakeAt is due."""
        here = self._runs
        if here.draining:
            return 0
        due = await self._store.list_due_timers(
            self._clock(), self._namespace, self._options.pending_batch * 10
        )
        count = 0
        for run in due:
            execution = here.execution(run.id)
            if execution is not None:
                if execution.resident:
                    execution.deliver(None, None)  # re-check what it waits for
                continue
            if run.locked_until is not None and run.locked_until > self._clock():
                continue  # resident on another instance; its own poller wakes it
            if unserved.is_parked(run) and not unserved.serves(self._workflows(), run):
                self._queue_recheck(run.id)
                continue
            here.dispatch(run.id)
            count += 1
        return count

    def _queue_recheck(self, run_id: str) -> None:
        """A parked run whose back-off ran out, of a workflow not registered here: re-checked
        by ONE background task, one run at a time. Runs parked together come due together,
        and a turn task for each (a lease and a write apiece) would take every store
        connection at once and keep the pick-up of real runs waiting behind them."""
        if run_id in self._rechecking:
            return
        self._rechecking.add(run_id)
        self._recheck_queue.append(run_id)
        if self._recheck_task is None or self._recheck_task.done():
            self._recheck_task = self._runs.spawn(self._recheck_parked())

    async def _recheck_parked(self) -> None:
        here = self._runs
        while self._recheck_queue and not here.draining:
            run_id = self._recheck_queue.popleft()
            try:
                if not here.holds(run_id):
                    await self._recheck_one(run_id)
            except Exception as exc:
                log.debug("could not re-check parked run %s (%s)", run_id, exc)
            finally:
                self._rechecking.discard(run_id)
        self._recheck_queue.clear()
        self._rechecking.clear()

    async def _recheck_one(self, run_id: str) -> None:
        now = self._clock()
        leased = await self._store.claim_run(
            run_id, self._instance_id, now + self._options.lease_ms, now
        )
        if leased is None:
            return  # someone else has it (a worker that serves it, or another re-check)
        if (
            unserved.is_parked(leased)
            and self._by_convention is None
            and not unserved.serves(self._workflows(), leased)
        ):
            await unserved.park(self._settle, leased, now)  # still nobody: the next back-off
            return
        # Changed meanwhile, or a remote worker may serve it: the driver decides, as for any
        # leased run (it runs it, or parks it again).
        self._runs.dispatch(run_id, claimed=leased)

    async def rescue_unserved(self) -> int:
        """Take, at once, the runs another engine (or this one, before a workflow was
        registered here) parked as unserved that this engine serves, instead of leaving them
        to their back-off: in a fleet where engine A serves W1 and engine B serves W2, A
        parks the W2 runs it happens to claim, and B must not wait A's back-off (up to five
        minutes) for them. One read per poll, bounded, through the (workflow, status) index;
        capability-blocked runs of the same workflows are listed too and skipped here (the
        due-timer poll re-checks those)."""
        here = self._runs
        if here.draining or not here.drive_runs:
            return 0
        workflows = self._workflows()
        names = sorted({wf.name for wf in workflows})
        by_convention = self._by_convention
        if not names and by_convention is None:
            return 0
        listed = await self._store.list_runs(
            RunQuery(
                # The set of names this engine can serve is open with convention routing:
                # every blocked run is a candidate then (through the status index).
                workflows=names if by_convention is None else None,
                statuses=["blocked"],
                namespace=self._namespace,
                limit=self._options.pending_batch,
            )
        )
        count = 0
        now = self._clock()
        remote: dict[tuple[str, str | None], bool] = {}
        for run in listed:
            if not unserved.is_parked(run):
                continue
            if not unserved.serves(workflows, run):
                if by_convention is None:
                    continue
                key = (run.workflow, run.namespace)
                if key not in remote:
                    if len(remote) >= _CONVENTION_CHECKS:
                        continue  # the rest waits for the next poll, or its back-off
                    try:
                        remote[key] = await by_convention(*key)
                    except Exception as exc:
                        log.debug("could not tell who serves %s (%s)", run.workflow, exc)
                        remote[key] = False
                if not remote[key]:
                    continue
            if here.holds(run.id):
                continue
            if run.locked_until is not None and run.locked_until > now:
                continue  # being re-checked elsewhere right now
            here.dispatch(run.id)  # run_one leases it; the driver unparks it
            count += 1
        return count

    async def sweep_timeouts(self) -> int:
        """Cancel runs older than their workflow's `execution_timeout`."""
        swept = 0
        now = self._clock()
        seen: set[str] = set()
        for wf in self._workflows():
            timeout = wf.execution_timeout_ms
            if timeout is None or wf.name in seen:
                continue
            seen.add(wf.name)
            runs = await self._store.list_runs(
                RunQuery(
                    workflow=wf.name,
                    statuses=["running", "suspended"],
                    namespace=self._namespace,
                )
            )
            for run in runs:
                created_ms = int(run.created_at.timestamp() * 1000)
                if created_ms <= now - timeout:
                    error = StepError(message="execution timeout", code="execution_timeout")
                    if await operator.cancel_with(self._plane, run, error):
                        swept += 1
        return swept

    # ------------------------------------------------------------------ leases

    async def lease_loop(self) -> None:
        """Renew the leases of every run this instance drives: ONE statement per interval."""
        interval = max(50, self._options.lease_ms // 2) / 1000.0
        while True:
            await asyncio.sleep(interval)
            try:
                await self.renew_leases()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("durably lease renewal failed")

    async def renew_leases(self) -> None:
        here = self._runs
        held = here.executing_ids()
        if not held:
            return
        until = self._clock() + self._options.lease_ms
        renewed = await self._store.renew_run_locks(self._instance_id, until)
        if renewed >= len(held):
            return
        lost: list[str] = []
        for run_id in held:
            if here.execution(run_id) is None:
                continue
            run = await self._store.get_run(run_id)
            if (
                run is not None
                and run.locked_by != self._instance_id
                and here.execution(run_id) is not None
            ):
                lost.append(run_id)
        for run_id in lost:
            execution = here.execution(run_id)
            if execution is None:
                continue
            # Another instance owns the run now: stop driving it here (no more writes).
            log.warning("lost the lease of run %s; dropping it on this instance", run_id)
            execution.cancelled = True
            execution.evict()
            if execution.task is not None:
                execution.task.cancel()

    # ------------------------------------------------------------------ drain

    async def drain(self, timeout: float) -> None:
        """Stop taking work; parked runs are evicted (they are durably suspended and their
        leases released so another instance can take them at once); turns still executing
        get `timeout` seconds, then are cancelled and their leases released."""
        here = self._runs
        here.begin_drain()
        for execution in here.executions():
            if execution.is_parked:
                execution.evict()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while here.busy:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            for execution in here.executions():
                if execution.is_parked:
                    execution.evict()
            await asyncio.sleep(min(0.02, remaining))
        for execution in here.executions():
            execution.cancelled = True
            if execution.task is not None:
                execution.task.cancel()
            try:
                await self._store.release_run_lock(execution.run_id)
            except Exception:
                log.debug("could not release %s during drain", execution.run_id, exc_info=True)
        # Let background notifications (child completions, deliveries) finish briefly, and
        # the ones they start meanwhile (a cancelled child's completion starts a mailbox
        # delivery).
        settle_by = loop.time() + max(0.0, min(1.0, deadline - loop.time()))
        while True:
            pending = here.pending_tasks()
            remaining = settle_by - loop.time()
            if not pending or remaining <= 0:
                break
            await asyncio.wait(pending, timeout=remaining)
