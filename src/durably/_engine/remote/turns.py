"""`RemoteTurns`: remote workflows, advanced one turn at a time by workflow workers.

The body of a remote workflow runs in a worker (the published durable-worker SDK, a
TypeScript worker, …); the engine owns every durable fact about the run. Each time the run is
driven (first start, a step result, a signal, a child's completion, a due timer, recovery) the
engine issues a NEW turn and supersedes any outstanding one:

1. `advance(run)`, under the run's lease: a `cancelling` run is finalized instead; a run
   routed to an onError handler follows its handoff instead; otherwise the history is read,
   a fresh task id minted, and ONE conditional write records `suspended`, the id the run now
   waits for (`awaiting_decision_task_id`), a liveness wake and the released lease. Only then
   is the task queued: a decision that comes back within a millisecond always finds its
   marker, and never collides with the lease. A task the broker refused leaves the run
   waiting for its liveness wake, which re-drives it.
2. `decisions(...)` (the transport's `TurnSink`): a decision applies only to the turn the run
   waits for, under the lease, and clears the marker first, so a late, duplicate or
   superseded decision (or one for a run cancelled meanwhile) writes nothing. Its commands are
   written (`remote_turns_apply`), then the run settles: `continue` → `suspended` until the
   earliest new timer (else the reconcile wake); `completed`; `failed` → onError routing, else
   failed; `cancelled`.
3. `step_events(...)` record the local steps a worker runs while a turn replays (live view;
   the decision's own record wins), and `run_heartbeats(...)` push the liveness wake of a run
   whose turn is still replaying.

Which runs are remote and where their turns go is `remote_turns_routing`'s business.

Waking: a delivery that lands while a decision holds the lease can only nudge the run's wake,
which the decision's own settle write then replaces. So once a `continue` decision released
the lease, every position it waits on is looked at once more, and a settled one drives the run
again at once (the same guard a local turn has).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from durably._core.bounds import DEFAULT_MAX_PAYLOAD_BYTES
from durably._core.errors import WorkflowNotFoundError
from durably._core.log_context import durably_logger
from durably._core.models import (
    TERMINAL_RUN_STATUSES,
    JSONValue,
    RunPatch,
    RunStatus,
    StepCheckpoint,
    StepError,
    WorkflowRun,
)
from durably._core.wire import WireFormatError
from durably._core.wire_turns import (
    HistoryEvent,
    WorkflowDecision,
    WorkflowStepEvent,
    WorkflowTask,
    parse_run_heartbeat,
    parse_workflow_decision,
    parse_workflow_step_event,
    turn_task_id,
)
from durably._engine.control.on_error import ChildStarter, live_handoff
from durably._engine.control.settle import (
    release_quietly,
    run_event,
    settle_terminal,
    update_if_status,
)
from durably._engine.control.start import StartRequest
from durably._engine.defs.events import EngineEvent
from durably._engine.defs.registry import OnErrorRoute, Workflow
from durably._engine.defs.remote_workflows import RemoteWorkflow
from durably._engine.defs.typed_io import PLAIN
from durably._engine.defs.vocab import (
    CANCELLED,
    CANCELLED_COMPLETION,
    completion_of_failure,
    parent_tag,
)
from durably._engine.remote.turn_commands import (
    LATE_STEP_EVENT,
    Applied,
    CommandRefusedError,
    StepDispatch,
    apply_commands,
    child_run_id,
    history_of,
    step_event,
    step_event_refusal,
    step_event_row,
    vet_commands,
)
from durably._engine.remote.turn_routes import (
    MAX_ANCESTORS,
    LiveWorkers,
    TurnRoute,
    WorkerDirectory,
    as_routes,
    convention_token,
    parent_of,
    start_version,
)
from durably._engine.run.children import completion_of_run
from durably._engine.run.saga import CancelHost

if TYPE_CHECKING:
    from durably._transport.protocol import TurnChannel

log = durably_logger("durably.remote")

__all__ = ["FailureRouting", "RemoteTurns", "RunCreator", "RunWaker"]

# A turn may be issued over any live status but `cancelling` (finalized instead).
_ADVANCING: tuple[RunStatus, ...] = ("pending", "running", "suspended", "blocked")
# A decision applies only to a run parked waiting for it.
_AWAITING: tuple[RunStatus, ...] = ("suspended",)
_SETTLED = ("completed", "failed")
# Above this many positions to re-check, one listing beats a read per position.
_LIST_OVER = 8


class FailureRouting(Protocol):
    """onError routing (the runtime's `Router`)."""

    async def route_failure(self, run: WorkflowRun, error: StepError) -> bool: ...

    async def follow_handoff(self, run: WorkflowRun, cps: Sequence[StepCheckpoint]) -> bool: ...


class RunWaker(Protocol):
    """Drives a run again after something it waits for happened (the runtime's `Deliveries`)."""

    async def redrive(self, run_id: str, cp: StepCheckpoint | None = None) -> None: ...


class RunCreator(Protocol):
    """Creates a run by workflow name (the control plane)."""

    async def create_run(self, request: StartRequest, json_input: JSONValue) -> str: ...


class RemoteTurns:
    """Remote workflow turns of this engine (module docstring).

    Collaborators: how runs settle and whom they tell (`host`), onError routing (`router`),
    how a run is driven again (`waker`), how a child is created by name (`creator`), the
    workflow-turn channel and the worker directory of the transport (None without one), where
    `call` steps are dispatched (`steps`, the transport pool), the registry lookup, how a
    registered child starts (`start_registered`), background tasks (`spawn`), the clock and
    the reconcile wake, and this engine's lease identity and namespace. `silence_ms` is how
    long a turn may go without a decision or a beat before it is issued again (None: the
    reconcile wake serves as that window). `max_payload_bytes` bounds every decision, step
    event and run heartbeat read from the channel.
    """

    def __init__(
        self,
        host: CancelHost,
        router: FailureRouting,
        waker: RunWaker,
        creator: RunCreator,
        *,
        channel: TurnChannel | None,
        directory: WorkerDirectory | None,
        steps: StepDispatch | None,
        registration: Callable[[str, str | None], Workflow[Any, Any] | None],
        start_registered: ChildStarter,
        spawn: Callable[[Coroutine[Any, Any, Any]], object],
        clock: Callable[[], int],
        fallback_wake_at: Callable[[], int | None],
        instance_id: str,
        namespace: str | None,
        lease_ms: int,
        silence_ms: int | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ):
        self._host = host
        self._store = host.store
        self._router = router
        self._waker = waker
        self._creator = creator
        self._channel = channel
        self._live = LiveWorkers(directory)
        self._steps = steps
        self._registration = registration
        self._start_registered = start_registered
        self._spawn = spawn
        self._clock = clock
        self._fallback_wake_at = fallback_wake_at
        self._instance_id = instance_id
        self._namespace = namespace
        self._lease_ms = lease_ms
        self._silence_ms = silence_ms
        self._max_bytes = max_payload_bytes

    async def start(self) -> None:
        """Start consuming decisions, step events and run heartbeats from the channel."""
        if self._channel is not None:
            await self._channel.start_turns(self)

    # ================================================================== which runs

    async def route(self, run: WorkflowRun) -> TurnRoute | None:
        """Where `run`'s turns go, or None when it is not a remote run (it runs here)."""
        registered = self._registration(run.workflow, run.workflow_version or None)
        if isinstance(registered, RemoteWorkflow):
            return TurnRoute(registered.token_for(run.namespace), "registered", registered)
        if registered is not None or self._channel is None:
            return None
        ancestor = await self._remote_ancestor(await self._parent(run))
        if ancestor is not None:
            return TurnRoute(ancestor.token_for(run.namespace), "inherited", ancestor)
        token = convention_token(run.workflow, run.namespace)
        if await self._live.serves(token):
            return TurnRoute(token, "convention")
        return None

    async def serves(self, run: WorkflowRun) -> bool:
        """Whether `run` is driven by remote turns (the turn driver's question)."""
        return await self.route(run) is not None

    async def drive_if_remote(self, run: WorkflowRun) -> bool:
        """The turn driver's hook, for a run it just leased: a remote run gets a new turn
        (True); any other run is left to the local driver (False). Never raises: when the
        store fails the lease is given back and the run is handled (True), so a store outage
        is never mistaken for "not registered here"."""
        try:
            route = await self.route(run)
        except Exception as exc:
            log.warning(
                "run %s: could not tell where it runs (%s); it will be retried", run.id, exc
            )
            await release_quietly(self._host, run.id)
            return True
        if route is None:
            return False
        await self.advance(run, route)
        return True

    async def serves_workflow(self, workflow: str, namespace: str | None) -> bool:
        """Whether a start of `workflow` (not registered here) can be served by convention:
        a live worker beats on its token in `namespace`."""
        if self._channel is None:
            return False
        return await self._live.serves(convention_token(workflow, namespace))

    async def _parent(self, run: WorkflowRun) -> WorkflowRun | None:
        parent_id = parent_of(run)
        return await self._store.get_run(parent_id) if parent_id is not None else None

    async def _remote_ancestor(self, run: WorkflowRun | None) -> RemoteWorkflow | None:
        """The registration of the nearest run, from `run` up its parents, registered here as
        a remote workflow; None when a run on the way runs here or the chain ends."""
        for _ in range(MAX_ANCESTORS):
            if run is None:
                return None
            registered = self._registration(run.workflow, run.workflow_version or None)
            if isinstance(registered, RemoteWorkflow):
                return registered
            if registered is not None:
                return None  # a local ancestor: its descendants are not remote by inheritance
            run = await self._parent(run)
        return None

    async def announced_routes(self, run: WorkflowRun) -> tuple[OnErrorRoute, ...]:
        """The onError routes of a run served by convention, as its live workers announce
        them (empty when they announce none, or disagree: then the reason is logged)."""
        token = convention_token(run.workflow, run.namespace)
        decision = await self._live.announced_routes(
            run.workflow, run.workflow_version or "1", token
        )
        if decision.unrouted is not None:
            # Workers mid-rollout announce different routes: routing by either could send the
            # failure to a handler the other half does not have. Not routed, and said so.
            log.warning("run %s is not routed: %s", run.id, decision.unrouted)
            self._host.events.emit(
                EngineEvent(
                    type="run.unrouted",
                    run_id=run.id,
                    workflow=run.workflow,
                    namespace=run.namespace,
                    reason=decision.unrouted,
                )
            )
        return as_routes(decision)

    # ================================================================== history

    async def history(self, run_id: str) -> list[HistoryEvent]:
        """The history a turn of the run is sent now."""
        return history_of(await self._store.list_checkpoints(run_id), self._clock())

    # ================================================================== issuing a turn

    async def advance(self, run: WorkflowRun, route: TurnRoute | None = None) -> None:
        """Issue a new turn of `run`, whose lease this process holds (module docstring);
        `route` when the caller already resolved it."""
        try:
            await self._advance(run, route)
        except Exception as exc:
            # The store failed before the task was queued: give the lease back so the run is
            # retried as soon as the store answers, not a whole lease later.
            log.warning(
                "run %s: could not issue its remote turn (%s); it will be retried", run.id, exc
            )
            await release_quietly(self._host, run.id)

    async def _advance(self, run: WorkflowRun, route: TurnRoute | None) -> None:
        store = self._store
        if run.status in TERMINAL_RUN_STATUSES or not self._in_namespace(run):
            await store.release_run_lock(run.id)
            return
        if run.status == "cancelling":
            await self._finish_cancel(run)
            return
        if route is None:
            route = await self.route(run)
        if route is None or self._channel is None:
            log.error(
                "run %s needs workflow %s@%s, which is neither registered on this engine nor "
                "served by a live worker reachable over a transport that carries workflow turns",
                run.id,
                run.workflow,
                run.workflow_version,
            )
            await store.release_run_lock(run.id)
            return
        cps = await store.list_checkpoints(run.id)
        if live_handoff(run.id, cps) is not None:
            # A run handed to its onError handler waits for the handler, not for a worker.
            await self._router.follow_handoff(run, cps)
            return
        now = self._clock()
        task_id = turn_task_id(run.id)
        patch: RunPatch = {
            "status": "suspended",
            "awaiting_decision_task_id": task_id,
            "wake_at": self._liveness_wake(now),
            "locked_by": None,
            "locked_until": None,
        }
        version = run.workflow_version
        if not version:
            # Started by name without a version: pin the one it runs now, for every later turn.
            version, tags = await self._start_version(route, run)
            patch["workflow_version"] = version
            if tags:
                patch["tags"] = tuple(dict.fromkeys([*(run.tags or ()), *tags]))
        task = WorkflowTask(
            task_id=task_id,
            run_id=run.id,
            workflow=run.workflow,
            workflow_version=version,
            input=run.input,
            history=tuple(history_of(cps, now)),
            group=route.token,
            priority=run.priority,
        )
        # Marked and released BEFORE the task leaves (module docstring).
        if not await update_if_status(self._host, run.id, patch, _ADVANCING):
            await release_quietly(self._host, run.id)  # cancelled meanwhile: never revive
            return
        events = self._host.events
        if run.status == "pending":
            events.emit(run_event("run.started", run))
        events.emit(run_event("run.suspended", run))
        self._host.wakes.announce_soon("settled", run.id)
        try:
            await self._channel.dispatch_turn(task.to_json(), token=route.token)
        except Exception as exc:
            log.warning(
                "run %s: turn %s was not queued on %s (%s); the run is issued a new turn at "
                "its liveness wake",
                run.id,
                task_id,
                route.token,
                exc,
            )

    async def _start_version(
        self, route: TurnRoute, run: WorkflowRun
    ) -> tuple[str, tuple[str, ...]]:
        if route.how == "registered" and route.registration is not None:
            return route.registration.version, ()
        version, tags = await start_version(self._live, run.workflow, route.token)
        return version, tuple(tags)

    def _liveness_wake(self, now: int) -> int | None:
        """When a turn that went silent (no decision, no beat) is issued again."""
        if self._silence_ms:
            return now + self._silence_ms
        return self._fallback_wake_at()

    async def _finish_cancel(self, run: WorkflowRun) -> None:
        """A compensating cancel of a remote run: the worker's body has no compensations
        registered with the engine, so it is finalized at once."""
        cancelled = await settle_terminal(
            self._host,
            run,
            {"status": "cancelled", "error": CANCELLED},
            run_event("run.failed", run, error=CANCELLED),
            CANCELLED_COMPLETION,
            statuses=("cancelling",),
        )
        if cancelled:
            self._host.fire_cancel(run.id)

    def _in_namespace(self, run: WorkflowRun) -> bool:
        return self._namespace is None or run.namespace in (self._namespace, None)

    # ================================================================== decisions (TurnSink)

    async def decisions(self, decisions: Sequence[dict[str, object]]) -> None:
        """Apply the decisions a transport consumed. A malformed one (or one asking for a
        command this engine lacks) is logged with its ids and dropped, before anything of it
        was written: the run keeps waiting for its liveness wake. Raises when a store failure
        kept a decision from being looked at (the transport then offers it again)."""
        by_run: dict[str, list[WorkflowDecision]] = {}
        for raw in decisions:
            try:
                decision = parse_workflow_decision(raw, max_bytes=self._max_bytes)
            except WireFormatError as exc:
                log.error("dropped a remote workflow decision: %s", exc)
                continue
            by_run.setdefault(decision.run_id, []).append(decision)
        outcomes = await asyncio.gather(
            *(self._apply_in_order(batch) for batch in by_run.values()), return_exceptions=True
        )
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            raise failures[0]

    async def _apply_in_order(self, batch: list[WorkflowDecision]) -> None:
        for decision in batch:
            await self.apply_decision(decision)

    async def apply_decision(self, decision: WorkflowDecision) -> bool:
        """Apply one decision if the run waits for exactly its turn; True when it was."""
        store = self._store
        run = await store.get_run(decision.run_id)
        if not self._awaits(run, decision):
            return False
        now = self._clock()
        leased = await store.claim_run(
            decision.run_id, self._instance_id, now + self._lease_ms, now
        )
        if leased is None:
            # Someone is issuing a newer turn right now: this one is superseded.
            log.debug("decision %s dropped: run %s is leased", decision.task_id, decision.run_id)
            return False
        if not self._awaits(leased, decision):
            await release_quietly(self._host, leased.id)
            return False
        try:
            rows = await vet_commands(
                store, leased, decision.commands, await self._route_group(leased)
            )
        except CommandRefusedError as exc:
            # Nothing of it was written and the marker stays: the run waits for its liveness
            # wake (a new turn), as for a malformed decision.
            log.error(
                "dropped remote workflow decision %s of run %s: %s",
                decision.task_id,
                decision.run_id,
                exc,
            )
            await release_quietly(self._host, leased.id)
            return False
        except BaseException:
            await release_quietly(self._host, leased.id)
            raise
        # The marker goes first: a duplicate arriving from now on is dropped. The reconcile
        # wake (instead of none) re-drives the run should this process fail before the end.
        cleared: RunPatch = {"awaiting_decision_task_id": None, "wake_at": self._fallback_wake_at()}
        if not await update_if_status(self._host, leased.id, cleared, _AWAITING):
            await release_quietly(self._host, leased.id)
            return False
        try:
            await self._settle_decision(leased, decision, rows)
        except Exception as exc:
            log.error(
                "run %s: applying decision %s failed (%s); the run gets a new turn at its "
                "reconcile wake",
                leased.id,
                decision.task_id,
                exc,
            )
            await release_quietly(self._host, leased.id)
        return True

    def _awaits(self, run: WorkflowRun | None, decision: WorkflowDecision) -> bool:
        if run is None:
            log.debug("decision %s dropped: run %s is gone", decision.task_id, decision.run_id)
            return False
        if run.awaiting_decision_task_id != decision.task_id or run.status not in _AWAITING:
            log.debug(
                "decision %s dropped: run %s is %s and waits for %s",
                decision.task_id,
                run.id,
                run.status,
                run.awaiting_decision_task_id,
            )
            return False
        return self._in_namespace(run)

    async def _route_group(self, run: WorkflowRun) -> str | None:
        """The group this engine registered `run`'s remote workflow with (or the ancestor's it
        inherits from), else None: the one partition besides the run's namespace its calls
        may name (`call_group_refusal`)."""
        registered = self._registration(run.workflow, run.workflow_version or None)
        if registered is None:
            registered = await self._remote_ancestor(await self._parent(run))
        return registered.group if isinstance(registered, RemoteWorkflow) else None

    async def _settle_decision(
        self, run: WorkflowRun, decision: WorkflowDecision, rows: dict[int, StepCheckpoint]
    ) -> None:
        host = self._host
        applied = await apply_commands(
            self._store, host.events, self._steps, run, decision.commands, self._clock(), rows
        )
        if decision.status == "continue":
            wake = applied.wake_at if applied.wake_at is not None else self._fallback_wake_at()
            await self._suspend(run, wake)
            await self._after_turn(run, applied)
        elif decision.status == "completed":
            output = decision.output
            await settle_terminal(
                host,
                run,
                {"status": "completed", "output": output, "error": None},
                run_event("run.completed", run, output=output),
                {"ok": True, "value": output},
                statuses=_AWAITING,
            )
        elif decision.status == "failed":
            await self._failed(run, decision.error or StepError(message="workflow failed"))
        else:
            # The worker saw the run cancelled (a cancel broadcast) and stopped at an operation
            # boundary, keeping the work done before it.
            error = run.error or CANCELLED
            if await settle_terminal(
                host,
                run,
                {"status": "cancelled", "error": error},
                run_event("run.failed", run, error=error),
                CANCELLED_COMPLETION,
                statuses=_AWAITING,
            ):
                host.fire_cancel(run.id)

    async def _suspend(self, run: WorkflowRun, wake: int | None) -> bool:
        patch: RunPatch = {
            "status": "suspended",
            "wake_at": wake,
            "locked_by": None,
            "locked_until": None,
        }
        if await update_if_status(self._host, run.id, patch, _AWAITING):
            return True
        await release_quietly(self._host, run.id)  # settled meanwhile (cancelled): leave it
        return False

    async def _failed(self, run: WorkflowRun, error: StepError) -> None:
        if error.code == "no_workflow":
            # The worker that took the turn does not hold this workflow: a deploy problem, not
            # the run's failure. The run waits (as a local run of an unregistered version
            # does) and is issued a new turn at its reconcile wake.
            log.error(
                "run %s: the worker on its queue has no workflow %s (%s); keep a worker with "
                "it deployed — the run is retried at its reconcile wake",
                run.id,
                run.workflow,
                error.message,
            )
            await self._suspend(run, self._fallback_wake_at())
            return
        if await self._router.route_failure(run, error):
            return
        await settle_terminal(
            self._host,
            run,
            {"status": "failed", "error": error},
            run_event("run.failed", run, error=error),
            completion_of_failure(error),
            statuses=_AWAITING,
        )

    async def _after_turn(self, run: WorkflowRun, applied: Applied) -> None:
        """What a `continue` decision leaves for after its settle: children to start, finished
        children to announce again, and the lost-wake re-check."""
        for _, child in applied.finished:
            completion = completion_of_run(child)
            if completion is not None:
                self._host.notify_parent(child, completion)
        for command in applied.start:
            child_id = child_run_id(run.id, command.seq)
            self.start_child_soon(
                command.workflow, command.input, child_id, run, None, run.priority
            )
        if applied.watch and await self._any_settled(run.id, applied.watch):
            await self._waker.redrive(run.id)

    async def _any_settled(self, run_id: str, seqs: list[int]) -> bool:
        store = self._store
        if len(seqs) > _LIST_OVER:
            wanted = set(seqs)
            rows = [cp for cp in await store.list_checkpoints(run_id) if cp.seq in wanted]
            return any(cp.status in _SETTLED for cp in rows)
        for seq in seqs:
            cp = await store.get_checkpoint(run_id, seq)
            if cp is not None and cp.status in _SETTLED:
                return True
        return False

    # ================================================================== children

    def start_child_soon(
        self,
        workflow: Workflow[Any, Any] | str,
        input: Any,
        child_id: str,
        parent: WorkflowRun,
        version: str | None,
        priority: int | None,
    ) -> None:
        """Start a child after the current turn (same signature as the runtime's). A child
        registered here starts as usual; one that is not starts by name when it is served
        remotely (by inheritance or convention). A start that fails is delivered to the parent
        as the child's failed completion, never swallowed."""
        name = workflow.name if isinstance(workflow, Workflow) else workflow
        if isinstance(workflow, Workflow) or self._registration(name, version) is not None:
            self._start_registered(workflow, input, child_id, parent, version, priority)
            return
        self._spawn(self._start_by_name(name, input, child_id, parent, priority))

    async def _start_by_name(
        self, name: str, input: Any, child_id: str, parent: WorkflowRun, priority: int | None
    ) -> None:
        try:
            ancestor = await self._remote_ancestor(parent)
            if ancestor is not None:
                token = ancestor.token_for(parent.namespace)
            else:
                token = convention_token(name, parent.namespace)
                if not await self._live.serves(token):
                    raise WorkflowNotFoundError(f"workflow {name} is not registered")
            version, tags = await start_version(self._live, name, token)
            request = StartRequest(
                workflow=name,
                run_id=child_id,
                tags=(parent_tag(parent.id), *tags),
                priority=priority,
                version=version,
                namespace=parent.namespace,
            )
            await self._creator.create_run(request, PLAIN.to_json(input))
        except Exception as exc:
            self._host.notify_parent(
                child_id, {"ok": False, "error": f'child workflow "{name}" failed to start: {exc}'}
            )

    # ================================================================== step events

    async def step_events(self, events: Sequence[dict[str, object]]) -> None:
        """Record the local steps workers report while a turn replays. Unusable ones are
        logged once with their ids and dropped (`_refusal` says which are usable). A row the
        turn's decision already settled is never touched: a late `running` must not hide a
        recorded outcome from the next history."""
        by_run: dict[str, list[WorkflowStepEvent]] = {}
        for raw in events:
            try:
                event = parse_workflow_step_event(raw, max_bytes=self._max_bytes)
            except WireFormatError as exc:
                log.warning("dropped a workflow step event: %s", exc)
                continue
            by_run.setdefault(event.run_id, []).append(event)
        outcomes = await asyncio.gather(
            *(self._record_events(run_id, batch) for run_id, batch in by_run.items()),
            return_exceptions=True,
        )
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            raise failures[0]

    async def _record_events(self, run_id: str, batch: list[WorkflowStepEvent]) -> None:
        store = self._store
        run = await store.get_run(run_id)
        refusal = await self._run_refusal(run)
        for event in batch:
            problem = refusal
            if problem is None:
                assert run is not None
                if event.task_id is not None and event.task_id != run.awaiting_decision_task_id:
                    problem = f"it names turn {event.task_id}, the run waits for another"
                else:
                    current = await store.get_checkpoint(run_id, event.seq)
                    problem = step_event_refusal(current, event)
            if problem is not None:
                # A worker's own event can lose the race with its turn's decision (they travel
                # on two queues): that is routine, so said quietly; anything else is not.
                late = problem.startswith(LATE_STEP_EVENT)
                log.log(
                    logging.INFO if late else logging.WARNING,
                    "dropped workflow step event %s:%d (%s, %s): %s",
                    run_id,
                    event.seq,
                    event.name,
                    event.phase,
                    problem,
                )
                continue
            assert run is not None
            cp = step_event_row(event, self._clock())
            await store.save_checkpoint(cp)
            self._host.events.emit(step_event(run, cp, "local"))

    async def _run_refusal(self, run: WorkflowRun | None) -> str | None:
        """Why no step event may touch `run`, else None. A step event is only the live view
        of a turn being replayed: it may only reach a remote-workflow run of this engine's
        namespace that waits for a decision right now (anyone who can write to the broker can
        send one, so a run that issued no turn must never take one: a forged `completed` row
        would be replayed as the step's outcome, its handler never run)."""
        if run is None:
            return "no such run"
        if not self._in_namespace(run):
            return "the run is outside this engine's namespace"
        if run.status not in _AWAITING or run.awaiting_decision_task_id is None:
            return f"{LATE_STEP_EVENT[0]} ({run.status})"
        if await self.route(run) is None:
            return "the run is not a remote workflow run"
        return None

    # ================================================================== run heartbeats

    async def run_heartbeats(self, beats: Sequence[dict[str, object]]) -> None:
        """A worker still replays a turn of these runs: push their liveness wake out. A beat
        for a single step (with `stepId`) is the step executor's business, not a turn's."""
        run_ids: list[str] = []
        for raw in beats:
            try:
                beat = parse_run_heartbeat(raw, max_bytes=self._max_bytes)
            except WireFormatError as exc:
                log.warning("dropped a run heartbeat: %s", exc)
                continue
            if beat.step_id is None:
                run_ids.append(beat.run_id)
        outcomes = await asyncio.gather(
            *(self._rearm(run_id) for run_id in dict.fromkeys(run_ids)), return_exceptions=True
        )
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if failures:
            raise failures[0]

    async def _rearm(self, run_id: str) -> None:
        # Under the lease, so a decision being applied (which sets the real wake) can never
        # be overwritten by a beat that raced it.
        now = self._clock()
        wake = self._liveness_wake(now)
        if wake is None:
            return
        run = await self._store.claim_run(run_id, self._instance_id, now + self._lease_ms, now)
        if run is None:
            return  # a turn is being issued or applied: it sets the wake itself
        if (
            run.status != "suspended"
            or run.awaiting_decision_task_id is None
            or not self._in_namespace(run)
            or (run.wake_at is not None and run.wake_at <= now)  # due or nudged: let it fire
        ):
            await release_quietly(self._host, run_id)
            return
        patch: RunPatch = {"wake_at": wake, "locked_by": None, "locked_until": None}
        if not await update_if_status(self._host, run_id, patch, _AWAITING):
            await release_quietly(self._host, run_id)
