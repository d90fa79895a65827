"""`TurnDriver`: lease a run, run one turn of its body (resident or replay), settle it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from pydantic import ValidationError

from durably._core.errors import (
    ConcurrencyLimitError,
    ContinueAsNew,
    InputValidationError,
    RunEvicted,
    SerializationError,
    SingletonQueueFullError,
    StoreFailure,
    WorkflowBlocked,
    WorkflowSuspended,
    error_of,
)
from durably._core.log_context import durably_logger, run_logging
from durably._core.models import (
    TERMINAL_RUN_STATUSES,
    RunPatch,
    StepCheckpoint,
    StepError,
    WorkflowRun,
    replace,
)
from durably._engine.control.on_error import live_handoff
from durably._engine.control.settle import (
    release_quietly,
    run_event,
    settle_completed,
    settle_failed_unrouted,
    settle_terminal,
    update_if_live,
)
from durably._engine.defs.events import EngineEvent
from durably._engine.defs.intercept import NO_INTERCEPTORS, Interceptors
from durably._engine.defs.registry import Workflow
from durably._engine.defs.typed_io import validation_details
from durably._engine.defs.vocab import next_continuation_id
from durably._engine.flow import quotas, singleton
from durably._engine.remote.turns import FailureRouting
from durably._engine.run import saga
from durably._engine.run.ctx import WorkflowCtx
from durably._engine.run.execution import AMBIENT_CTX, Execution, ReplayNow
from durably._engine.run.host import RunHost
from durably._engine.run.saga import CancelHost
from durably._engine.worker import unserved
from durably._engine.worker.runs import BackgroundTasks, ExecutingRuns, Redispatch

log = durably_logger("durably.worker")

# How often a blocked run looks again for a worker that offers what its next step requires.
BLOCKED_RECHECK_MS = 5_000


class Continuation(Protocol):
    """Starts the run that continues `run` as new (its id given), newest version."""

    def __call__(self, run: WorkflowRun, input: Any, run_id: str) -> Coroutine[Any, Any, Any]: ...


class RemoteRuns(Protocol):
    """Runs whose bodies run in workflow workers (the runtime's `RemoteTurns`)."""

    async def drive_if_remote(self, run: WorkflowRun) -> bool:
        """Issue a remote turn of a leased run and return True; False when it runs here."""
        ...

    async def serves_workflow(self, workflow: str, namespace: str | None) -> bool:
        """Whether a live workflow worker serves `workflow` by convention in `namespace`."""
        ...


class TurnRuns(ExecutingRuns, Redispatch, BackgroundTasks, Protocol):
    """What a turn asks of the runs here: is one of the run's turns executing already, may
    a new one start, the bracket around the turn, whether the run was created here a moment
    ago, one more turn, and where a continued run's successor starts."""

    @property
    def draining(self) -> bool: ...

    def take_fresh(self, run_id: str) -> bool:
        """True (once) when this process created the run and no turn of it ran yet."""
        ...

    def turn_began(self, execution: Execution) -> None: ...

    def turn_ended(self, run_id: str) -> None: ...


class TurnDriver:
    """Drives runs on this process: lease → one turn (resident or replay) → settle.

    Collaborators: the runtime a turn executes in (`host`), how runs are settled
    (`settle`), which runs execute here (`runs`), onError routing (`router`), the
    workflows registered here, and how a continued run starts its successor.
    """

    def __init__(
        self,
        host: RunHost,
        settle: CancelHost,
        runs: TurnRuns,
        router: FailureRouting,
        *,
        clock: Callable[[], int],
        lease_ms: int,
        instance_id: str,
        namespace: str | None,
        registration: Callable[[str, str | None], Workflow[Any, Any] | None],
        fallback_wake_at: Callable[[], int | None],
        continue_as: Continuation,
        remote: RemoteRuns | None = None,
        interceptors: Interceptors = NO_INTERCEPTORS,
    ):
        self._host = host
        self._interceptors = interceptors
        self._settle = settle
        self._store = settle.store
        self._runs = runs
        self._router = router
        self._clock = clock
        self._lease_ms = lease_ms
        self._instance_id = instance_id
        self._namespace = namespace
        self._registration = registration
        self._fallback_wake_at = fallback_wake_at
        self._continue_as = continue_as
        self._remote = remote
        # The unserved workflows logged already (once per workflow and version).
        self._unserved_logged = unserved.LogOnce()

    async def run_one(self, run_id: str) -> bool:
        """Lease the run, then execute one turn on this instance.

        Returns False when the lease could not be taken (another instance holds it).
        """
        here = self._runs
        if here.execution(run_id) is not None:
            return True
        if here.draining:
            return False
        now = self._clock()
        lease_until = now + self._lease_ms
        run = await self._store.claim_run(run_id, self._instance_id, lease_until, now)
        if run is None:
            return False
        if here.execution(run_id) is not None:  # raced with another local dispatch
            return True
        await self.drive(run)
        return True

    async def drive(self, run: WorkflowRun) -> None:
        """Execute one turn of a run whose lease this instance holds."""
        parked_checks = 0
        if unserved.is_parked(run):
            # Parked because no worker served it: still nobody here → parked again, with a
            # longer back-off; else back to the status it was parked from, and on.
            if not await self._served(run):
                await self._park_unserved(run)
                return
            parked_checks = unserved.check_count(run)
            unparked = await unserved.unpark(self._settle, run)
            if unparked is None:
                return
            run = unparked
        if self._remote is not None and await self._remote.drive_if_remote(run):
            return  # a remote workflow: its turn went to a workflow worker
        if (
            run.status in unserved.PARKABLE
            and self._in_namespace(run)
            and self._registration(run.workflow, run.workflow_version or None) is None
        ):
            # Nobody here serves it (drive_if_remote found no remote route either): parked
            # with a back-off, out of the pending backlog. Releasing it instead made it the
            # next claim's first run again, forever, and jammed the runs behind it. (A run
            # just unparked keeps its count: it is not logged as new when the route its
            # worker seemed to offer is not there after all.)
            await self._park_unserved(run, parked_checks)
            return
        try:
            prepared = await self._prepare_turn(run)
        except Exception as exc:
            # The store failed before the turn began: give the lease back so the run is
            # retried at once once the store answers again, not a whole lease later.
            log.warning("run %s: could not start its turn (%s); it will be retried", run.id, exc)
            await release_quietly(self._settle, run.id)
            return
        if prepared is None:
            return
        # A routed run follows its handoff; the body is NOT run again.
        if live_handoff(run.id, prepared[2]) is not None:
            try:
                await self._router.follow_handoff(prepared[0], prepared[2])
            except Exception as exc:
                log.warning("run %s: could not follow its onError handoff (%s)", run.id, exc)
                await release_quietly(self._settle, run.id)
            return
        execution = Execution(self._host, *prepared)
        self._runs.turn_began(execution)
        execution.task = asyncio.current_task()
        try:
            await self._interceptors.turn(execution.run, bool(prepared[2]), self._turn, execution)
        finally:
            self._runs.turn_ended(run.id)

    def _in_namespace(self, run: WorkflowRun) -> bool:
        return self._namespace is None or run.namespace in (self._namespace, None)

    async def _served(self, run: WorkflowRun) -> bool:
        """Whether this engine can run a turn of `run` now: a registration of its name and
        version, or (with workflow workers) a live worker serving it by convention."""
        if self._registration(run.workflow, run.workflow_version or None) is not None:
            return True
        if self._remote is None:
            return False
        try:
            return await self._remote.serves_workflow(run.workflow, run.namespace)
        except Exception as exc:
            log.debug("run %s: could not tell who serves it (%s)", run.id, exc)
            return False

    async def _park_unserved(self, run: WorkflowRun, parked_before: int | None = None) -> None:
        self._runs.take_fresh(run.id)  # its first turn is not now
        try:
            await unserved.park(
                self._settle,
                run,
                self._clock(),
                parked_before=parked_before or None,
                once=self._unserved_logged,
            )
        except Exception as exc:
            log.warning("run %s: could not park it (%s); it will be retried", run.id, exc)
            await release_quietly(self._settle, run.id)

    async def _prepare_turn(
        self, run: WorkflowRun
    ) -> tuple[WorkflowRun, Workflow[Any, Any], list[StepCheckpoint]] | None:
        """Mark the run running and load its history; None when the turn must not run."""
        store = self._store
        if run.status in TERMINAL_RUN_STATUSES or (
            self._namespace is not None and run.namespace not in (self._namespace, None)
        ):
            await store.release_run_lock(run.id)
            return None
        # An empty version: started by name without one, by a process without the workflow's
        # code (`durably.Client`) — this engine's newest registered version runs it.
        workflow = self._registration(run.workflow, run.workflow_version or None)
        if workflow is None:
            # Not registered here: the run waits (the prior version must stay deployed so
            # in-flight runs drain). Said once per workflow: the run is retried at every
            # poll, and an ERROR per poll buried every other line of the log.
            if self._unserved_logged.first(run.workflow, run.workflow_version):
                log.error(
                    "run %s needs workflow %s@%s, which is not registered on this engine — "
                    "keep the prior version deployed so in-flight runs can drain",
                    run.id,
                    run.workflow,
                    run.workflow_version,
                )
            await store.release_run_lock(run.id)
            return None
        # A run created here has no checkpoints to read on its first turn — only while it is
        # still pending: one another engine claimed first may have run turns meanwhile, and
        # replaying it from nothing would run its completed steps again.
        fresh = self._runs.take_fresh(run.id) and run.status == "pending"
        # The workflow's key functions run here, where its code is: a run started by name
        # without the code is checked against its quota and singleton depth at its first
        # turn (`quotas.late_start`). A key or limit function that refuses the input fails
        # the run with that error: asking again would only fail again — not an outage.
        try:
            late = await quotas.late_start(workflow, run) if run.status == "pending" else None
            s_tag = singleton.line_tag(run, workflow)
        except Exception as exc:
            await settle_failed_unrouted(self._settle, run, error_of(exc))
            return None
        if late is not None and late.gate is not None:
            outcome = await store.gate_untagged_run(run.id, late.tags, late.gate)
            if outcome.verdict == "exists":  # settled (cancelled) since it was claimed
                await store.release_run_lock(run.id)
                return None
            if outcome.verdict != "created":
                # Over the limit: failed with the error the start would have raised (the
                # decision is `quotas.late_start`'s). Not routed: the body never ran, and a
                # route that retried it would only be refused again.
                try:
                    quotas.refuse(
                        outcome, late, name=run.workflow, run_id=run.id, on_duplicate="return"
                    )
                except (ConcurrencyLimitError, SingletonQueueFullError) as refusal:
                    await settle_failed_unrouted(self._settle, run, error_of(refusal))
                return None
            run = replace(run, tags=tuple(dict.fromkeys([*(run.tags or ()), *late.tags])))
            if s_tag is None:
                s_tag = singleton.line_tag(run, workflow)
        admitted = await singleton.admit(self._store, run, workflow, s_tag, self._clock())
        if admitted is None:  # another run of its singleton key holds the slot: parked
            self._settle.events.emit(
                EngineEvent(
                    type="run.suspended",
                    run_id=run.id,
                    workflow=run.workflow,
                    namespace=run.namespace,
                )
            )
            return None
        run = admitted
        if run.status == "pending":
            started: RunPatch = {"status": "running"}
            if not run.workflow_version:
                # Pin the version it runs now, so every later turn (on any worker) replays it.
                started["workflow_version"] = workflow.version
                run = replace(run, workflow_version=workflow.version)
            if not await update_if_live(self._settle, run.id, started):
                await store.release_run_lock(run.id)  # cancelled between claim and start
                return None
            run = replace(run, status="running")
            self._settle.events.emit(
                EngineEvent(
                    type="run.started",
                    run_id=run.id,
                    workflow=run.workflow,
                    namespace=run.namespace,
                )
            )
        elif run.status in ("suspended", "blocked"):
            # durably: a re-driven run reads `running` while its turn executes, so a crash in
            # the turn is found by recovery at once instead of at its old wakeAt.
            if not await update_if_live(
                self._settle, run.id, {"status": "running", "wake_at": None}
            ):
                await store.release_run_lock(run.id)
                return None
            run = replace(run, status="running", wake_at=None)
        # A run this instance created a moment ago has no checkpoints yet: skip the read.
        checkpoints = [] if fresh else await store.list_checkpoints(run.id)
        return run, workflow, checkpoints

    async def _turn(self, ex: Execution) -> None:
        with run_logging(ex.run_id, ex.run.workflow):  # records logged in the turn name it
            await self._turn_in_context(ex)

    async def _turn_in_context(self, ex: Execution) -> None:
        """One turn of the body, then the settle of how it ended (one method per outcome).
        The ambient ctx stays set while an exit unwinds (compensations may use it), and is
        reset before a body that returned is settled."""
        ctx = WorkflowCtx(ex)
        token = AMBIENT_CTX.set(ctx)
        try:
            result = await ex.workflow.invoke(ctx, _decode_input(ex.workflow, ex.run.input))
        except ReplayNow:
            return await self._replay_now(ex)
        except StoreFailure as failure:
            return await self._store_failed(ex, failure)
        except RunEvicted:
            return await self._evicted(ex)
        except WorkflowBlocked as blocked:
            return await self._blocked(ex, blocked)
        except WorkflowSuspended as suspended:
            return await self._suspended(ex, suspended.wake_at)
        except ContinueAsNew as cont:
            return await self._continued(ex, cont.input)
        except asyncio.CancelledError:
            await self._interrupted(ex)
            raise
        except Exception as exc:
            return await self._failed(ex, exc)
        finally:
            AMBIENT_CTX.reset(token)
        await self._completed(ex, result)

    async def _cancel_wins(self, ex: Execution) -> bool:
        """A cancel asked for while the turn ran wins over how it ended: the saga unwinds
        and the run is cancelled. True when that happened."""
        if not ex.cancel_requested:
            return False
        await saga.compensate_and_cancel(self._settle, ex)
        return True

    async def _replay_now(self, ex: Execution) -> None:
        """The body must replay from its history at once: a new turn, right after this one."""
        await ex.close()
        await self._store.release_run_lock(ex.run_id)
        self._runs.dispatch(ex.run_id)

    async def _store_failed(self, ex: Execution, failure: StoreFailure) -> None:
        """The store failed under the body: nothing is settled, the lease is given back, and
        the run resumes from its last checkpoint once the store answers again."""
        await ex.close()
        log.error(
            "run %s: the store failed during its turn (%s); the run resumes from its last "
            "checkpoint once the store is back",
            ex.run_id,
            failure.cause,
        )
        await release_quietly(self._settle, ex.run_id)

    async def _evicted(self, ex: Execution) -> None:
        """The body's waits were ended from outside (a cancel, a stop, the drain, room for
        other resident runs)."""
        await ex.close()
        if ex.cancel_requested and not ex.cancelled:
            await saga.compensate_and_cancel(self._settle, ex)
            return
        if ex.cancelled:
            return
        if ex.evicted_unsuspended:
            # Evicted while only waiting for steps in flight, before `suspended` was
            # written: write it now, or the run would read `running` with no lease and
            # recovery would count an attempt against it.
            await self._settle_suspended(ex, ex.evicted_wake_at)
            return
        await self._store.release_run_lock(ex.run_id)

    async def _blocked(self, ex: Execution, blocked: WorkflowBlocked) -> None:
        """No live worker offers what the next step requires."""
        await ex.close()
        if await self._cancel_wins(ex):
            return
        await self._park_blocked(ex, blocked)

    async def _suspended(self, ex: Execution, wake_at: int | None) -> None:
        """The body waits for something outside it (a timer, a signal, a child, a step)."""
        await ex.close()
        if await self._cancel_wins(ex):
            return
        await self._settle_suspended(ex, wake_at)

    async def _continued(self, ex: Execution, new_input: Any) -> None:
        """The body continued as new."""
        await ex.close()
        if await self._cancel_wins(ex):
            return
        await self._settle_continued(ex, new_input)

    async def _interrupted(self, ex: Execution) -> None:
        """The turn's task was cancelled (a stop, a lost lease, the close); the caller
        re-raises."""
        if ex.cancelled:
            return  # engine.cancel wrote the outcome and released the lease
        await release_quietly(self._settle, ex.run_id)

    async def _failed(self, ex: Execution, exc: Exception) -> None:
        """The body raised: its saga unwinds, then the run fails (or is routed onError)."""
        await ex.close()
        if ex.cancelled:
            return
        if await self._cancel_wins(ex):
            return
        # Unwind the saga BEFORE settle(failed) and its onError routing; the run fails
        # with the ORIGINAL error.
        if ex.compensations and not await saga.unwind(ex):
            await release_quietly(self._settle, ex.run_id)  # store failed: recovery re-drives
            return
        await self.settle_failed(ex.run, error_of(exc))

    async def _completed(self, ex: Execution, result: Any) -> None:
        """The body returned: its output is stored and the run completes."""
        await ex.close()
        if ex.cancelled:
            return
        if await self._cancel_wins(ex):
            return
        workflow = ex.workflow
        try:
            output = workflow.output_codec.to_json(result)
        except SerializationError as exc:
            await self.settle_failed(
                ex.run,
                StepError(
                    message=(
                        f"workflow {workflow.name!r} returned a value that cannot be stored: {exc}"
                    ),
                    code="serialization",
                ),
            )
            return
        await settle_completed(self._settle, ex.run, output)

    async def settle_failed(self, run: WorkflowRun, error: StepError) -> None:
        # onError routing first; a failure settled by follow_handoff is final and never
        # routed again (it calls settle.settle_failed_unrouted directly).
        if await self._router.route_failure(run, error):
            return
        await settle_failed_unrouted(self._settle, run, error)

    async def _settle_suspended(self, ex: Execution, wake_at: int | None) -> None:
        """Settle `suspended` (the reconcile fallback wake when there is no natural one),
        unless the run was settled meanwhile; then the lost-wake guard below."""
        natural = wake_at if wake_at is not None else self._fallback_wake_at()
        patch: RunPatch = {
            "status": "suspended",
            "wake_at": natural,
            "locked_by": None,
            "locked_until": None,
        }
        if not await update_if_live(self._settle, ex.run_id, patch):
            await release_quietly(self._settle, ex.run_id)
            return
        self._settle.events.emit(
            EngineEvent(
                type="run.suspended",
                run_id=ex.run_id,
                workflow=ex.run.workflow,
                namespace=ex.run.namespace,
            )
        )
        self._settle.wakes.announce_soon("settled", ex.run_id)
        # A delivery that raced this turn found the lease taken and only nudged `wakeAt`,
        # which the write above may have overwritten: look at the awaited rows once more.
        if len(ex.waiting_seqs) > 8:
            # A fan waits on many rows: one listing instead of a read per member.
            rows = await self._store.list_checkpoints(ex.run_id)
            if any(cp.seq in ex.waiting_seqs and _wakes(cp) for cp in rows):
                self._runs.dispatch(ex.run_id)
            return
        for seq in sorted(ex.waiting_seqs):
            cp = await self._store.get_checkpoint(ex.run_id, seq)
            if cp is not None and _wakes(cp):
                self._runs.dispatch(ex.run_id)
                return

    async def _park_blocked(self, ex: Execution, blocked: WorkflowBlocked) -> None:
        """No live worker offers what the next step requires: park the run `blocked` with the
        reason as its error, re-checked every few seconds (the due-timer poll re-drives it),
        and tell subscribers why (`run.blocked`)."""
        error = StepError(message=blocked.reason, code=blocked.code, retryable=True)
        patch: RunPatch = {
            "status": "blocked",
            "error": error,
            "wake_at": self._clock() + BLOCKED_RECHECK_MS,
            "locked_by": None,
            "locked_until": None,
        }
        if not await update_if_live(self._settle, ex.run_id, patch):
            await release_quietly(self._settle, ex.run_id)
            return
        self._settle.events.emit(
            EngineEvent(
                type="run.blocked",
                run_id=ex.run_id,
                workflow=ex.run.workflow,
                namespace=ex.run.namespace,
                error=error,
                requires=blocked.requires or None,
                reason=blocked.reason,
                diagnostics=blocked.diagnostics,
            )
        )
        self._settle.wakes.announce_soon("settled", ex.run_id)

    async def _settle_continued(self, ex: Execution, new_input: Any) -> None:
        """ContinueAsNew: complete (no output) and start `<id>~N` unpinned (newest version)."""
        run = ex.run
        completed = await settle_terminal(
            self._settle,
            run,
            {"status": "completed", "output": None, "error": None},
            run_event("run.completed", run),
            {"ok": True, "value": None},
        )
        if completed:
            self._runs.spawn(self._continue_as(run, new_input, next_continuation_id(run.id)))


def _wakes(cp: StepCheckpoint) -> bool:
    """An awaited row that ends the wait: completed, or a remote step's failed attempt (its
    retry or its error is the body's next move)."""
    return cp.status == "completed" or (cp.kind == "remote" and cp.status == "failed")


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
